package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/sendonce/sendonce/internal/deadletter"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testing/natstest"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/internal/testing/testkit"
	"github.com/sendonce/sendonce/internal/wire"
	"github.com/sendonce/sendonce/outbox"
)

type opsEnv struct {
	pool *pgxpool.Pool
	env  map[string]string
	nats *natstest.Server
}

func setupOps(t *testing.T) *opsEnv {
	t.Helper()
	pool, url := pgtest.NewPool(t)
	srv := natstest.Start(t)
	srv.EnsureTopology(t)
	return &opsEnv{pool: pool, nats: srv, env: map[string]string{"DATABASE_URL": url, "NATS_URL": srv.URL()}}
}

func (o *opsEnv) run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut testkit.Buffer
	code := run(context.Background(), append([]string{"relay"}, args...), testkit.EnvMap(o.env), &out, &errOut)
	return code, out.String(), errOut.String()
}

// kill makes a row dead with a dead letter, as a sender would.
func (o *opsEnv) kill(t *testing.T, status outbox.State, reason string) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	var id uuid.UUID
	err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		var err error
		id, err = outbox.Enqueue(ctx, tx, "+15557654321", "the secret body")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.pool.Exec(ctx, `UPDATE sms_outbox SET status = $2, end_reason = $3, attempt_count = 3, last_error = 'http 400: bad' WHERE id = $1`, id, string(status), reason); err != nil {
		t.Fatal(err)
	}
	if _, err := o.pool.Exec(ctx, `INSERT INTO sms_attempts (outbox_id, attempt, started_at, latency_ms, outcome, http_status, provider_code, error, sender)
		VALUES ($1, 1, now(), 12.5, 'permanent', 400, 21211, 'http 400: bad', 'test')`, id); err != nil {
		t.Fatal(err)
	}
	o.letter(t, id, 0, reason, deadletter.IdempotencyUnknown)
	return id
}

// letter publishes a dead letter of row id, generation gen.
func (o *opsEnv) letter(t *testing.T, id uuid.UUID, gen int32, reason string, idem deadletter.Idempotency) {
	t.Helper()
	_, js := o.nats.Connect(t)
	_, err := deadletter.Publisher{JetStream: js}.Publish(context.Background(), deadletter.Letter{
		OutboxID: id, Gen: gen, Reason: reason, Error: "http 400: bad", Attempts: 3, ProviderCode: 21211,
		Payload: wire.AppendEncode(nil, wire.Send{ID: id, Gen: gen}), Idempotency: idem,
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestDLQListFiltersByReason(t *testing.T) {
	t.Parallel()
	o := setupOps(t)
	perm := o.kill(t, outbox.StatusDead, wire.ReasonPermanent)
	amb := o.kill(t, outbox.StatusUnknown, wire.ReasonAmbiguous)
	code, out, errOut := o.run(t, "dlq", "list")
	if code != 0 || !strings.Contains(out, perm.String()) || !strings.Contains(out, amb.String()) || !strings.Contains(out, "2 dead letters") {
		t.Fatalf("list: exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = o.run(t, "dlq", "list", "-reason", "ambiguous", "-since", "1h")
	if code != 0 || strings.Contains(out, perm.String()) || !strings.Contains(out, amb.String()) {
		t.Fatalf("filtered list: exit %d\n%s", code, out)
	}
	code, out, _ = o.run(t, "dlq", "list", "-since", time.Now().Add(time.Hour).Format(time.RFC3339))
	if code != 0 || !strings.Contains(out, "0 dead letters") {
		t.Fatalf("future since: exit %d\n%s", code, out)
	}
	if code, _, errOut := o.run(t, "dlq", "list", "-reason", "bogus"); code != 2 || !strings.Contains(errOut, "-reason") {
		t.Fatalf("bad reason: exit %d %s", code, errOut)
	}
}

func TestDLQReplay(t *testing.T) {
	t.Parallel()
	o := setupOps(t)
	ctx := context.Background()
	dead := o.kill(t, outbox.StatusDead, wire.ReasonPermanent)

	// Dry run: nothing changes.
	code, out, errOut := o.run(t, "dlq", "replay", "-id", dead.String(), "-dry-run")
	if code != 0 || !strings.Contains(out, "would replay") {
		t.Fatalf("dry run: exit %d\n%s%s", code, out, errOut)
	}
	if st, _ := outbox.Status(ctx, o.pool, dead); st.Status != outbox.StatusDead {
		t.Fatalf("dry run changed the row to %s", st.Status)
	}

	code, out, errOut = o.run(t, "dlq", "replay", "-id", dead.String())
	if code != 0 || !strings.Contains(out, "1 replayed") {
		t.Fatalf("replay: exit %d\n%s%s", code, out, errOut)
	}
	var status string
	var gen, attempts int
	if err := o.pool.QueryRow(ctx, `SELECT status, publish_gen, attempt_count FROM sms_outbox WHERE id = $1`, dead).Scan(&status, &gen, &attempts); err != nil {
		t.Fatal(err)
	}
	if status != "pending" || gen != 1 || attempts != 0 {
		t.Fatalf("after replay: status %s gen %d attempts %d; want pending, 1, 0", status, gen, attempts)
	}

	// A sent row is refused.
	sent := o.kill(t, outbox.StatusDead, wire.ReasonPermanent)
	if _, err := o.pool.Exec(ctx, `UPDATE sms_outbox SET status = 'sent' WHERE id = $1`, sent); err != nil {
		t.Fatal(err)
	}
	code, out, _ = o.run(t, "dlq", "replay", "-id", sent.String())
	if code == 0 || !strings.Contains(out, "refused: already sent") {
		t.Fatalf("replay of a sent row: exit %d\n%s", code, out)
	}

	// By reason: the unknown row's letter does not say its provider honours
	// keys, so it needs -force and is listed first; then it is replayed.
	unknown := o.kill(t, outbox.StatusUnknown, wire.ReasonAmbiguous)
	code, out, errOut = o.run(t, "dlq", "replay", "-reason", "ambiguous", "-since", "1h")
	if code != 0 || !strings.Contains(out, unknown.String()+"  refused: unknown at a provider") || !strings.Contains(out, "1 unknown rows need -force") {
		t.Fatalf("replay of an unknown row without -force: exit %d\n%s%s", code, out, errOut)
	}
	if st, _ := outbox.Status(ctx, o.pool, unknown); st.Status != outbox.StatusUnknown {
		t.Fatalf("the refused row is %s", st.Status)
	}
	code, out, errOut = o.run(t, "dlq", "replay", "-reason", "ambiguous", "-since", "1h", "-force")
	if code != 0 || !strings.Contains(out, unknown.String()+"  replayed (was unknown") {
		t.Fatalf("replay by reason with -force: exit %d\n%s%s", code, out, errOut)
	}
	// An unknown row whose letter records an idempotent provider needs no
	// -force: the provider would replay its stored answer.
	safe := o.kill(t, outbox.StatusUnknown, wire.ReasonAmbiguous)
	o.letter(t, safe, 0, wire.ReasonAmbiguous, deadletter.ProviderIdempotent) // a duplicate: the first letter stays
	safe2 := o.kill(t, outbox.StatusDead, wire.ReasonPermanent)
	if _, err := o.pool.Exec(ctx, `UPDATE sms_outbox SET status = 'unknown', end_reason = 'ambiguous', publish_gen = 1 WHERE id = $1`, safe2); err != nil {
		t.Fatal(err)
	}
	o.letter(t, safe2, 1, wire.ReasonAmbiguous, deadletter.ProviderIdempotent)
	code, out, errOut = o.run(t, "dlq", "replay", "-id", safe2.String())
	if code != 0 || !strings.Contains(out, safe2.String()+"  replayed") {
		t.Fatalf("replay of an unknown row at an idempotent provider: exit %d\n%s%s", code, out, errOut)
	}
	_ = safe
	code, out, _ = o.run(t, "dlq", "replay", "-reason", "permanent", "-limit", "100")
	if code != 0 || !strings.Contains(out, "still in flight (pending)") || !strings.Contains(out, "already sent") {
		t.Fatalf("replay by reason permanent: exit %d\n%s", code, out)
	}
	if code, _, errOut := o.run(t, "dlq", "replay"); code != 2 || !strings.Contains(errOut, "-id") {
		t.Fatalf("replay without a selector: exit %d %s", code, errOut)
	}
}

// evidence records a receipt or a lookup of row id, as the receiver, a
// sender or relay resolve does.
func (o *opsEnv) evidence(t *testing.T, id uuid.UUID, kind, result, source string) {
	t.Helper()
	if _, err := o.pool.Exec(context.Background(), `INSERT INTO sms_evidence (outbox_id, kind, result, source) VALUES ($1, $2, $3, $4)`,
		id, kind, result, source); err != nil {
		t.Fatal(err)
	}
}

// A row with evidence that the provider may have its message (a receipt; a
// lookup that found it once, or more) is refused, with that evidence named,
// unless forced: even an unknown row whose letter records an idempotent
// provider (whose key may have expired since). A lookup that found nothing
// or failed is no such evidence.
func TestDLQReplayRefusesRowsTheProviderMayHave(t *testing.T) {
	t.Parallel()
	o := setupOps(t)
	ctx := context.Background()
	// Dead before receipts moved dead rows, its receipt recorded only.
	received := o.kill(t, outbox.StatusDead, wire.ReasonPermanent)
	o.evidence(t, received, "receipt", "delivered", "generic")
	found := o.kill(t, outbox.StatusDead, wire.ReasonPermanent)
	o.evidence(t, found, "lookup", "none", "sender")
	o.evidence(t, found, "lookup", "found", "resolve")
	several := o.kill(t, outbox.StatusUnknown, wire.ReasonAmbiguous)
	o.letter(t, several, 0, wire.ReasonAmbiguous, deadletter.ProviderIdempotent) // a duplicate: the first letter stays
	if _, err := o.pool.Exec(ctx, `UPDATE sms_outbox SET publish_gen = 1 WHERE id = $1`, several); err != nil {
		t.Fatal(err)
	}
	o.letter(t, several, 1, wire.ReasonAmbiguous, deadletter.ProviderIdempotent)
	o.evidence(t, several, "lookup", "several", "sender")
	o.evidence(t, several, "lookup", "several", "resolve")
	nothing := o.kill(t, outbox.StatusDead, wire.ReasonPermanent)
	o.evidence(t, nothing, "lookup", "none", "resolve")
	o.evidence(t, nothing, "lookup", "failed", "sender")

	for id, why := range map[uuid.UUID]string{
		received: "refused: the provider may have the message: a delivered receipt from generic at ",
		found:    "refused: the provider may have the message: a lookup by resolve at ",
		several:  "refused: the provider may have the message: a lookup by resolve at ",
	} {
		code, out, errOut := o.run(t, "dlq", "replay", "-id", id.String())
		if code != 1 || !strings.Contains(out, id.String()+"  "+why) || !strings.Contains(out, "a replay may send it again") ||
			!strings.Contains(out, "1 rows need -force: a receipt or a lookup says the provider may have the message") {
			t.Errorf("replay -id of a row with evidence: exit %d\n%s%s", code, out, errOut)
		}
	}
	if _, out, _ := o.run(t, "dlq", "replay", "-id", found.String(), "-dry-run"); !strings.Contains(out, "found it; a replay may send it again") {
		t.Errorf("a lookup that found it once:\n%s", out)
	}
	if _, out, _ := o.run(t, "dlq", "replay", "-id", several.String(), "-dry-run"); !strings.Contains(out, "found it more than once, with 1 more such records;") {
		t.Errorf("the newest of two lookups is named, with the count of the others:\n%s", out)
	}
	code, out, errOut := o.run(t, "dlq", "replay", "-reason", "permanent", "-since", "1h")
	if code != 0 || !strings.Contains(out, nothing.String()+"  replayed (was dead") || !strings.Contains(out, "1 replayed, 2 refused") ||
		!strings.Contains(out, "2 rows need -force: a receipt or a lookup") {
		t.Fatalf("replay by reason: exit %d\n%s%s", code, out, errOut)
	}
	for id, want := range map[uuid.UUID]outbox.State{received: outbox.StatusDead, found: outbox.StatusDead, several: outbox.StatusUnknown, nothing: outbox.StatusPending} {
		if st, _ := outbox.Status(ctx, o.pool, id); st.Status != want {
			t.Errorf("row %s is %s, want %s", id, st.Status, want)
		}
	}
	code, out, errOut = o.run(t, "dlq", "replay", "-id", several.String(), "-force")
	if code != 0 || !strings.Contains(out, several.String()+"  replayed (was unknown; forced, though the provider may have it: a lookup by resolve at ") {
		t.Fatalf("replay -force: exit %d\n%s%s", code, out, errOut)
	}
	if st, _ := outbox.Status(ctx, o.pool, several); st.Status != outbox.StatusPending {
		t.Errorf("the forced row is %s", st.Status)
	}
}

// A stale letter replays nothing: a row dead (permanent) in generation 0 was
// replayed and ended unknown in generation 1; its old permanent letter must
// not put it back through the provider.
func TestDLQReplayIgnoresStaleLetters(t *testing.T) {
	t.Parallel()
	o := setupOps(t)
	ctx := context.Background()
	id := o.kill(t, outbox.StatusDead, wire.ReasonPermanent)
	if code, out, errOut := o.run(t, "dlq", "replay", "-id", id.String()); code != 0 {
		t.Fatalf("replay: exit %d\n%s%s", code, out, errOut)
	}
	// Generation 1 ends unknown, with its own letter.
	if _, err := o.pool.Exec(ctx, `UPDATE sms_outbox SET status = 'unknown', end_reason = 'ambiguous', attempt_count = 1 WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	o.letter(t, id, 1, wire.ReasonAmbiguous, deadletter.ProviderNotIdempotent)

	code, out, errOut := o.run(t, "dlq", "replay", "-reason", "permanent", "-since", "1h", "-force")
	if code != 0 || !strings.Contains(out, "refused: stale letter (generation 0, permanent)") || !strings.Contains(out, "0 replayed") {
		t.Fatalf("replay -reason permanent: exit %d\n%s%s", code, out, errOut)
	}
	var status string
	var gen int
	if err := o.pool.QueryRow(ctx, `SELECT status, publish_gen FROM sms_outbox WHERE id = $1`, id).Scan(&status, &gen); err != nil {
		t.Fatal(err)
	}
	if status != "unknown" || gen != 1 {
		t.Fatalf("row is %s in generation %d; a stale letter moved it", status, gen)
	}
	// Its current letter does describe it; at a provider without
	// idempotency it still needs -force.
	code, out, _ = o.run(t, "dlq", "replay", "-reason", "ambiguous", "-since", "1h")
	if code != 0 || !strings.Contains(out, "need -force") {
		t.Fatalf("replay -reason ambiguous: exit %d\n%s", code, out)
	}
}

func TestTraceShowsRowAttemptsAndLetters(t *testing.T) {
	t.Parallel()
	o := setupOps(t)
	id := o.kill(t, outbox.StatusDead, wire.ReasonPermanent)
	code, out, errOut := o.run(t, "trace", id.String())
	if code != 0 {
		t.Fatalf("trace: exit %d %s", code, errOut)
	}
	for _, want := range []string{"status        dead", "+1********21", "15 characters", "attempts (1)", "permanent", "21211", "dead letters (1)", "reason permanent",
		// In words: where it stands, what the provider answered, what
		// was decided.
		"in short      not sent, and it will not be: no provider took it (permanent); relay dlq replay -id " + id.String(),
		"HTTP 400, code 21211", "refused for good: not tried again"} {
		if !strings.Contains(out, want) {
			t.Errorf("trace lacks %q:\n%s", want, out)
		}
	}
	for _, secret := range []string{"+15557654321", "the secret body"} {
		if strings.Contains(out, secret) {
			t.Errorf("trace shows %q", secret)
		}
	}
	if strings.Contains(out, "maybe taken") {
		t.Errorf("trace claims an attempt may have been taken:\n%s", out)
	}
	unknown := o.kill(t, outbox.StatusUnknown, wire.ReasonAmbiguous)
	if _, err := o.pool.Exec(context.Background(), `UPDATE sms_outbox SET maybe_accepted = true WHERE id = $1`, unknown); err != nil {
		t.Fatal(err)
	}
	if _, out, _ := o.run(t, "trace", unknown.String()); !strings.Contains(out, "maybe taken   yes") {
		t.Errorf("trace of a row an attempt of which may have been taken:\n%s", out)
	}
	if code, _, _ := o.run(t, "trace", uuid.NewString()); code != 1 {
		t.Errorf("trace of a missing row: exit %d, want 1", code)
	}
	if code, _, _ := o.run(t, "trace", "not-a-uuid"); code != 2 {
		t.Errorf("trace of a bad id: exit %d, want 2", code)
	}
}

// publishLetters stores n letters of rows that do not exist, as a large
// dead-letter stream would hold, and returns their sequences.
func (o *opsEnv) publishLetters(t *testing.T, n int, reason string) []uint64 {
	t.Helper()
	_, js := o.nats.Connect(t)
	p := deadletter.Publisher{JetStream: js}
	seqs := make([]uint64, 0, n)
	for range n {
		id := uuid.New()
		seq, err := p.Publish(context.Background(), deadletter.Letter{OutboxID: id, Reason: reason, Error: "http 400: bad", Attempts: 1,
			Payload: wire.AppendEncode(nil, wire.Send{ID: id})})
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, seq)
	}
	return seqs
}

// letterLines returns the sequences of the letters a list printed.
func letterLines(t *testing.T, out string) []string {
	t.Helper()
	var seqs []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 3 && f[0] != "SEQ" && (f[3] == wire.ReasonPermanent || f[3] == wire.ReasonMaxAttempts) {
			seqs = append(seqs, f[0])
		}
	}
	return seqs
}

// A list shows one page of -limit letters and the cursor of the next; the
// pages together are the stream, each letter once.
func TestDLQListPages(t *testing.T) {
	t.Parallel()
	o := setupOps(t)
	seqs := o.publishLetters(t, 250, wire.ReasonPermanent)
	code, out, errOut := o.run(t, "dlq", "list")
	if code != 0 {
		t.Fatalf("list: exit %d\n%s%s", code, out, errOut)
	}
	if got := letterLines(t, out); len(got) != 100 {
		t.Fatalf("the default page holds %d letters, want 100:\n%s", len(got), out)
	}
	var all []string
	after := "0"
	for page := 0; ; page++ {
		code, out, errOut := o.run(t, "dlq", "list", "-limit", "60", "-after", after)
		if code != 0 {
			t.Fatalf("page %d: exit %d\n%s%s", page, code, out, errOut)
		}
		got := letterLines(t, out)
		all = append(all, got...)
		_, next, more := strings.Cut(out, "more: the next page is -after ")
		if !more {
			if len(got) != 250-4*60 {
				t.Fatalf("last page holds %d letters, want %d", len(got), 250-4*60)
			}
			break
		}
		if len(got) != 60 {
			t.Fatalf("page %d holds %d letters, want 60:\n%s", page, len(got), out)
		}
		after = strings.TrimSpace(next)
		if after != got[len(got)-1] {
			t.Fatalf("page %d: next cursor %s, last letter %s", page, after, got[len(got)-1])
		}
	}
	if len(all) != len(seqs) || all[0] != fmt.Sprint(seqs[0]) || all[len(all)-1] != fmt.Sprint(seqs[len(seqs)-1]) {
		t.Fatalf("the pages hold %d letters (%s..%s), want %d (%d..%d)", len(all), all[0], all[len(all)-1], len(seqs), seqs[0], seqs[len(seqs)-1])
	}
	for _, bad := range [][]string{{"-limit", "0"}, {"-limit", "10001"}} {
		if code, _, errOut := o.run(t, append([]string{"dlq", "list"}, bad...)...); code != 2 || !strings.Contains(errOut, "-limit") {
			t.Errorf("list %v: exit %d %s", bad, code, errOut)
		}
	}
}

// A replay by reason with neither -since nor -limit would replay (and lock)
// every row of the stream: it is refused.
func TestDLQReplayByReasonNeedsSinceOrLimit(t *testing.T) {
	t.Parallel()
	o := setupOps(t)
	id := o.kill(t, outbox.StatusDead, wire.ReasonPermanent)
	code, out, errOut := o.run(t, "dlq", "replay", "-reason", "permanent")
	if code != 2 || !strings.Contains(errOut, "needs -since T or -limit N") {
		t.Fatalf("replay -reason alone: exit %d\n%s%s", code, out, errOut)
	}
	if st, _ := outbox.Status(context.Background(), o.pool, id); st.Status != outbox.StatusDead {
		t.Fatalf("the refused replay moved the row to %s", st.Status)
	}
	for _, bad := range [][]string{{"-since", "1h", "-batch", "0"}, {"-since", "1h", "-rate", "0"}, {"-limit", "-1"}, {"-id", id.String(), "-limit", "5"}} {
		if code, _, errOut := o.run(t, append([]string{"dlq", "replay", "-reason", "permanent"}, bad...)...); code != 2 {
			t.Errorf("replay %v: exit %d %s", bad, code, errOut)
		}
	}
}

// A replay by reason of N letters commits ceil(N/batch) transactions: each
// replayed row's xmin is the transaction that wrote it.
func TestDLQReplayCommitsInBatches(t *testing.T) {
	t.Parallel()
	o := setupOps(t)
	ctx := context.Background()
	const n, batch = 25, 10
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = o.kill(t, outbox.StatusDead, wire.ReasonPermanent)
	}
	xacts := func(ids []uuid.UUID) int {
		var k int
		if err := o.pool.QueryRow(ctx, `SELECT count(DISTINCT xmin::text) FROM sms_outbox WHERE id = ANY($1) AND status = 'pending'`, ids).Scan(&k); err != nil {
			t.Fatal(err)
		}
		return k
	}

	code, out, errOut := o.run(t, "dlq", "replay", "-reason", "permanent", "-since", "1h", "-batch", fmt.Sprint(batch), "-rate", "100000")
	want := (n + batch - 1) / batch
	if code != 0 || !strings.Contains(out, fmt.Sprintf("%d replayed, 0 refused (%d transactions)", n, want)) {
		t.Fatalf("replay -since: exit %d\n%s%s", code, out, errOut)
	}
	if k := xacts(ids); k != want {
		t.Fatalf("%d rows replayed in batches of %d were written by %d transactions, want %d", n, batch, k, want)
	}

	// Seven rows die again in generation 1. From the cursor past the old
	// letters, -limit 5 -batch 2 replays the first 5 in 3 transactions and
	// leaves the other two.
	_, js := o.nats.Connect(t)
	cursor, err := deadletter.LastSeq(ctx, js, "")
	if err != nil {
		t.Fatal(err)
	}
	again := ids[:7]
	if _, err := o.pool.Exec(ctx, `UPDATE sms_outbox SET status = 'dead', end_reason = 'permanent' WHERE id = ANY($1)`, again); err != nil {
		t.Fatal(err)
	}
	for _, id := range again {
		o.letter(t, id, 1, wire.ReasonPermanent, deadletter.IdempotencyUnknown)
	}
	code, out, errOut = o.run(t, "dlq", "replay", "-reason", "permanent", "-after", fmt.Sprint(cursor), "-limit", "5", "-batch", "2", "-rate", "100000")
	if code != 0 || !strings.Contains(out, "5 replayed, 0 refused (3 transactions)") || !strings.Contains(out, "more letters match: the next are -after ") {
		t.Fatalf("replay -limit 5: exit %d\n%s%s", code, out, errOut)
	}
	if k := xacts(again[:5]); k != 3 {
		t.Fatalf("5 rows replayed in batches of 2 were written by %d transactions, want 3", k)
	}
	var dead int
	if err := o.pool.QueryRow(ctx, `SELECT count(*) FROM sms_outbox WHERE id = ANY($1) AND status = 'dead'`, again[5:]).Scan(&dead); err != nil {
		t.Fatal(err)
	}
	if dead != 2 {
		t.Fatalf("%d of the 2 rows beyond -limit are still dead", dead)
	}
}

// hostile is text a forged dead letter or a compromised writer of a row
// could carry: a terminal title and screen-clear sequence, a C1 CSI, bidi
// overrides and isolates, marks, a line separator and a phone number.
const hostile = "\x1b]0;pwned\x07 \u202eevil\u202c \u009b2J \u2066x\u2069 \u200e\u200f\u061c\u2028 call +1 - 555 - 123 - 4567"

// hostileName is hostile without the number, for identifiers an operator
// searches by (a provider's id, a sender's name), which are shown as they
// are but for the controls.
const hostileName = "\x1b]0;pwned\x07\u202eevil\u202c\u009b2J\u2066x\u2069\u200e\u200f\u061c\u2028"

// shown reports what of hostile's payload is left in operator output.
func shown(out string) []string {
	var left []string
	for _, r := range out {
		if r != '\n' && (unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)) {
			left = append(left, fmt.Sprintf("%U", r))
		}
	}
	if strings.Contains(out, "4567") {
		left = append(left, "the number")
	}
	return left
}

// A forged dead letter and a row whose text holds terminal controls, bidi
// overrides and a number print cleaned in dlq list and trace.
func TestOperatorOutputIsCleaned(t *testing.T) {
	t.Parallel()
	o := setupOps(t)
	ctx := context.Background()
	id := o.kill(t, outbox.StatusDead, wire.ReasonPermanent)
	if _, err := o.pool.Exec(ctx, `UPDATE sms_outbox SET last_error = $2, provider_ref = $3 WHERE id = $1`, id, hostile, hostileName); err != nil {
		t.Fatal(err)
	}
	if _, err := o.pool.Exec(ctx, `INSERT INTO sms_attempts (outbox_id, attempt, started_at, outcome, error, sender)
		VALUES ($1, 2, now(), 'retry', $2, $3)`, id, hostile, hostileName); err != nil {
		t.Fatal(err)
	}
	if _, err := o.pool.Exec(ctx, `INSERT INTO sms_evidence (outbox_id, kind, result, provider_ref, detail, source)
		VALUES ($1, 'lookup', $2, $3, $2, $2)`, id, hostile, hostileName); err != nil {
		t.Fatal(err)
	}
	// A letter crafted on the dead-letter subject, not by a sender.
	_, js := o.nats.Connect(t)
	m := nats.NewMsg(streams.SubjectDeadLetter)
	m.Data = []byte(hostile)
	m.Header.Set(wire.HeaderOutboxID, id.String())
	m.Header.Set(wire.HeaderReason, hostile)
	m.Header.Set(wire.HeaderError, hostile)
	m.Header.Set(wire.HeaderGen, "7")
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}

	code, out, errOut := o.run(t, "dlq", "list")
	if code != 0 || !strings.Contains(out, "2 dead letters") {
		t.Fatalf("dlq list: exit %d %s\n%s", code, errOut, out)
	}
	if left := shown(out); len(left) > 0 {
		t.Errorf("dlq list shows %v:\n%q", left, out)
	}
	code, out, errOut = o.run(t, "trace", id.String())
	if code != 0 || !strings.Contains(out, "dead letters (2)") || !strings.Contains(out, "evil") {
		t.Fatalf("trace: exit %d %s\n%s", code, errOut, out)
	}
	if left := shown(out); len(left) > 0 {
		t.Errorf("trace shows %v:\n%q", left, out)
	}
}
