package receiver_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sendonce/sendonce/internal/receiver"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

// rowOf inserts a row in status, claimed for provider (NULL for "") unless
// pending, with the provider id ref (NULL for "").
func (f *fixture) rowOf(status, provider, ref string) uuid.UUID {
	f.t.Helper()
	id := uuid.New()
	reason := map[string]any{"unknown": "ambiguous", "dead": "permanent"}[status]
	if _, err := f.admin.Exec(context.Background(), `INSERT INTO sms_outbox (id, to_e164, body, status, end_reason, provider, provider_ref, attempt_count)
		VALUES ($1, '+15551234567', 'Your code is 482901', $2, $3, nullif($4, ''), nullif($5, ''), CASE WHEN $2 = 'pending' THEN 0 ELSE 1 END)`,
		id, status, reason, provider, ref); err != nil {
		f.t.Fatal(err)
	}
	return id
}

// A valid receipt the database refuses (another provider's row, a row no
// provider was asked to send, another message than the row's) is answered
// 200 like a receipt for no row, so that the provider stops sending it,
// and changes nothing; it is counted as refused, never as a contradiction
// of a dead row. Migration 0025.
func TestRefusedReceiptsAreAnsweredAndCounted(t *testing.T) {
	t.Parallel()
	f := start(t, func(c *receiver.Config) { c.TwilioToken = "" })
	twilios := f.rowOf("sending", "twilio", "")
	twiliosDead := f.rowOf("dead", "twilio", "")
	unsent := f.rowOf("pending", "", "")
	other := f.rowOf("sent", "", "SM_own")
	mine := f.rowOf("sending", "", "")
	sign := func(b []byte) string { return receiver.SignGeneric(secret, b, time.Now()) }
	for _, tt := range []struct {
		name, result, status string
		id                   uuid.UUID
		body                 []byte
	}{
		{"a sending row of Twilio's", "refused", "sending", twilios, receiptBody(twilios.String(), "delivered")},
		{"a dead row of Twilio's", "refused", "dead", twiliosDead, receiptBody(twiliosDead.String(), "delivered")},
		{"a pending row never claimed", "refused", "pending", unsent, receiptBody(unsent.String(), "delivered")},
		{"another message than the row's", "refused", "sent", other, receiptBody(other.String(), "undelivered")},
		{"a row of the provider this receiver settles unnamed rows for", "applied", "delivered", mine, receiptBody(mine.String(), "delivered")},
	} {
		code, result := f.post(tt.body, sign(tt.body))
		if code != 200 || result != tt.result {
			t.Errorf("%s: %d %q, want 200 %q", tt.name, code, result, tt.result)
		}
		if st, _ := f.status(tt.id); st != tt.status {
			t.Errorf("%s: the row is %s, want %s", tt.name, st, tt.status)
		}
		if n, want := f.evidence(tt.id), map[bool]int{true: 0, false: 1}[tt.result == "refused"]; n != want {
			t.Errorf("%s: %d receipts recorded, want %d", tt.name, n, want)
		}
	}
	for result, want := range map[string]float64{"refused": 4, "contradicted": 0, "applied": 1} {
		if got := f.count("generic", result); got != want {
			t.Errorf("sendonce_receipts_total{generic,%s} = %v, want %v", result, got, want)
		}
	}
}

// Rows that name no provider take the receipts of one provider: the one
// the receiver verifies receipts of when it verifies one kind only, else
// the one DefaultProvider names; none when it verifies several and names
// none. A DefaultProvider whose receipts the receiver does not verify is
// refused at start.
func TestRowsNamingNoProviderTakeTheDefaultProvidersReceipts(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		edit   func(*receiver.Config)
		result string
	}{
		{"generic only", func(c *receiver.Config) { c.TwilioToken = "" }, "applied"},
		{"generic and Twilio, no default", func(c *receiver.Config) { c.PublicURL = "https://r.example.com" }, "refused"},
		{"generic and Twilio, generic the default", func(c *receiver.Config) {
			c.PublicURL, c.DefaultProvider = "https://r.example.com", "generic"
		}, "applied"},
		{"generic and Twilio, Twilio the default", func(c *receiver.Config) {
			c.PublicURL, c.DefaultProvider = "https://r.example.com", "twilio"
		}, "refused"},
		{"generic only, none the default", func(c *receiver.Config) { c.TwilioToken, c.DefaultProvider = "", "none" }, "refused"},
	} {
		f := start(t, tt.edit)
		id := f.rowOf("sending", "", "")
		b := receiptBody(id.String(), "delivered")
		if code, result := f.post(b, receiver.SignGeneric(secret, b, time.Now())); code != 200 || result != tt.result {
			t.Errorf("%s: %d %q, want 200 %q", tt.name, code, result, tt.result)
		}
	}
	pool, _ := pgtest.NewPool(t)
	_, err := receiver.New(receiver.Config{Pool: pool, Secrets: [][]byte{secret}, DefaultProvider: "vonage"})
	if err == nil || !strings.Contains(err.Error(), "DefaultProvider") {
		t.Errorf("a default provider whose receipts the receiver does not verify: %v; want it refused, naming DefaultProvider", err)
	}
}
