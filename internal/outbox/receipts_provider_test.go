package outbox_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

// A receipt applies only to a row of the provider that signed it, and
// only where that provider can have the message: a row it was claimed
// for (an attempt, a lease, an answer), and, where the row records the
// provider's id for its message, a receipt about that message. Any other
// is refused and changes nothing, neither the row nor its evidence; the
// receiver answers it 2xx like a receipt for no row. A row that names no
// provider (a single SMS_PROVIDER, or attempted before migration 0019)
// belongs to the provider the receiver is told (Receipt.Unnamed).
// Everything runs as sendonce_receiver, through the database's function.
// Migration 0025.
func TestReceiptsApplyOnlyToTheirProvidersRows(t *testing.T) {
	t.Parallel()
	owner, url := pgtest.NewPool(t)
	ctx := context.Background()
	receiver := rolePool(t, url, "sendonce_receiver")
	row := func(set string, args ...any) uuid.UUID {
		t.Helper()
		id := enqueue(t, owner, "+15551234567", "Your code is 482901")
		if set != "" {
			exec(t, owner, `UPDATE sms_outbox SET `+set+` WHERE id = $1`, append([]any{id}, args...)...)
		}
		return id
	}
	cases := []struct {
		name   string
		id     uuid.UUID
		r      outbox.Receipt
		refuse string
		want   outbox.State
	}{
		{"a generic receipt for a pending row of Twilio's",
			row(`provider = 'twilio'`),
			outbox.Receipt{Status: outbox.StatusDelivered, ProviderRef: "msg_1", Source: "generic", Unnamed: "generic"},
			outbox.RefusedProvider, outbox.StatusPending},
		{"a Sinch receipt for a dead row of Vonage's",
			row(`provider = 'vonage', status = 'dead', end_reason = 'permanent', attempt_count = 1, letter_seq = 4`),
			outbox.Receipt{Status: outbox.StatusDelivered, ProviderRef: "sinch_1", Source: "sinch"},
			outbox.RefusedProvider, outbox.StatusDead},
		{"a generic receipt for a sending row of Twilio's",
			row(`provider = 'twilio', status = 'sending', attempt_count = 1, claim_id = gen_random_uuid()`),
			outbox.Receipt{Status: outbox.StatusUndelivered, Source: "generic"},
			outbox.RefusedProvider, outbox.StatusSending},
		{"Twilio's own receipt for its sending row",
			row(`provider = 'twilio', status = 'sending', attempt_count = 1, claim_id = gen_random_uuid()`),
			outbox.Receipt{Status: outbox.StatusDelivered, ProviderRef: "SM1", Source: "twilio"},
			"", outbox.StatusDelivered},
		{"Vonage's own receipt for its dead row (the provider had it)",
			row(`provider = 'vonage', status = 'dead', end_reason = 'permanent', attempt_count = 1, letter_seq = 4`),
			outbox.Receipt{Status: outbox.StatusDelivered, ProviderRef: "vonage_1", Source: "vonage"},
			"", outbox.StatusDelivered},
		{"a receipt for a pending row never claimed",
			row(``),
			outbox.Receipt{Status: outbox.StatusDelivered, ProviderRef: "msg_2", Source: "generic", Unnamed: "generic"},
			outbox.RefusedUnsent, outbox.StatusPending},
		{"a receipt for a queued row never claimed",
			row(`status = 'queued', provider = 'twilio'`),
			outbox.Receipt{Status: outbox.StatusSent, ProviderRef: "SM2", Source: "twilio"},
			outbox.RefusedUnsent, outbox.StatusQueued},
		{"a receipt for a dead row never claimed",
			row(`status = 'dead', end_reason = 'permanent', letter_seq = 4`),
			outbox.Receipt{Status: outbox.StatusDelivered, ProviderRef: "msg_3", Source: "generic", Unnamed: "generic"},
			outbox.RefusedUnsent, outbox.StatusDead},
		{"a receipt for a queued row waiting for its retry",
			row(`status = 'queued', attempt_count = 1, provider = 'twilio'`),
			outbox.Receipt{Status: outbox.StatusSent, ProviderRef: "SM3", Source: "twilio"},
			"", outbox.StatusSent},
		{"a receipt about another message than the row's",
			row(`status = 'sent', attempt_count = 1, provider_ref = 'msg_a', sent_at = now()`),
			outbox.Receipt{Status: outbox.StatusUndelivered, ProviderRef: "msg_b", Source: "generic", Unnamed: "generic"},
			outbox.RefusedReference, outbox.StatusSent},
		{"a receipt about the row's own message",
			row(`status = 'sent', attempt_count = 1, provider_ref = 'msg_c', sent_at = now()`),
			outbox.Receipt{Status: outbox.StatusDelivered, ProviderRef: "msg_c", Source: "generic", Unnamed: "generic"},
			"", outbox.StatusDelivered},
		{"a receipt that names no message, for a row with the provider's id",
			row(`status = 'sent', attempt_count = 1, provider_ref = 'msg_d', sent_at = now()`),
			outbox.Receipt{Status: outbox.StatusDelivered, Source: "generic", Unnamed: "generic"},
			"", outbox.StatusDelivered},
		{"a receipt for a row naming no provider, from the provider it belongs to",
			row(`status = 'unknown', end_reason = 'ambiguous', attempt_count = 1, letter_seq = 5, maybe_accepted = true`),
			outbox.Receipt{Status: outbox.StatusSent, ProviderRef: "msg_e", Source: "generic", Unnamed: "generic"},
			"", outbox.StatusSent},
		{"a receipt for a row naming no provider, from another",
			row(`status = 'unknown', end_reason = 'ambiguous', attempt_count = 1, letter_seq = 5, maybe_accepted = true`),
			outbox.Receipt{Status: outbox.StatusSent, ProviderRef: "SM4", Source: "twilio", Unnamed: "generic"},
			outbox.RefusedProvider, outbox.StatusUnknown},
		{"a receipt for a row naming no provider, where none may settle such rows",
			row(`status = 'sending', attempt_count = 1, claim_id = gen_random_uuid()`),
			outbox.Receipt{Status: outbox.StatusDelivered, ProviderRef: "msg_f", Source: "generic", Unnamed: outbox.NoProvider},
			outbox.RefusedProvider, outbox.StatusSending},
	}
	// A row replayed (its attempts given back) whose earlier attempts are
	// logged: its provider may have the message.
	replayed := row(`status = 'pending', publish_gen = 1, provider = 'twilio'`)
	exec(t, owner, `INSERT INTO sms_attempts (outbox_id, attempt, started_at, outcome, provider) VALUES ($1, 1, now(), 'ambiguous', 'twilio')`, replayed)
	cases = append(cases, struct {
		name   string
		id     uuid.UUID
		r      outbox.Receipt
		refuse string
		want   outbox.State
	}{"a receipt for a replayed row with an attempt logged", replayed,
		outbox.Receipt{Status: outbox.StatusDelivered, ProviderRef: "SM5", Source: "twilio"}, "", outbox.StatusDelivered})

	for _, c := range cases {
		c.r.ID = c.id
		var res []outbox.ReceiptResult
		err := pgx.BeginFunc(ctx, receiver, func(tx pgx.Tx) error {
			var err error
			res, err = outbox.ApplyReceipts(ctx, tx, []outbox.Receipt{c.r})
			return err
		})
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if res[0].Refused != c.refuse || res[0].Applied != (c.refuse == "") || !res[0].Found {
			t.Errorf("%s: %+v; want refused %q", c.name, res[0], c.refuse)
		}
		if c.refuse != "" && res[0].Contradicted() {
			t.Errorf("%s: a refused receipt counts as contradicting its dead row", c.name)
		}
		var st string
		var evidence int
		if err := owner.QueryRow(ctx, `SELECT status, (SELECT count(*) FROM sms_evidence e WHERE e.outbox_id = o.id)
			FROM sms_outbox o WHERE id = $1`, c.id).Scan(&st, &evidence); err != nil {
			t.Fatal(err)
		}
		if outbox.State(st) != c.want {
			t.Errorf("%s: the row is %s, want %s", c.name, st, c.want)
		}
		if wantEv := map[bool]int{true: 0, false: 1}[c.refuse != ""]; evidence != wantEv {
			t.Errorf("%s: %d receipts recorded, want %d", c.name, evidence, wantEv)
		}
	}
}
