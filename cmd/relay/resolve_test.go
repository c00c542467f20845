package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/internal/wire"
	"github.com/sendonce/sendonce/outbox"
)

// relay resolve, as the relay's own role, at a provider without
// idempotency: a row the provider has once is settled with its id and
// fate, one it never got is settled dead, one it has twice stays unknown,
// one unknown too recently is skipped. A dry run writes nothing; trace
// shows the lookups.
func TestResolveSettlesUnknownRows(t *testing.T) {
	t.Parallel()
	o := setupOps(t)
	stub, err := smsstub.New(smsstub.Config{IgnoreKeys: true, APIKey: "resolve-key-1", Receipts: smsstub.Receipts{Delay: time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(stub.Handler())
	t.Cleanup(func() { hs.Close(); _ = stub.Close() })
	send := func(id uuid.UUID) {
		body, _ := json.Marshal(map[string]string{"to": "+15557654321", "body": "b", "reference": id.String()})
		req, _ := http.NewRequest(http.MethodPost, hs.URL+"/v1/messages", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer resolve-key-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	once, never, twice, recent := o.kill(t, outbox.StatusUnknown, wire.ReasonAmbiguous), o.kill(t, outbox.StatusUnknown, wire.ReasonAmbiguous),
		o.kill(t, outbox.StatusUnknown, wire.ReasonAmbiguous), o.kill(t, outbox.StatusUnknown, wire.ReasonAmbiguous)
	send(once)
	send(twice)
	send(twice)
	if _, err := o.pool.Exec(context.Background(), `UPDATE sms_outbox SET maybe_accepted = true,
		updated_at = CASE WHEN id = $1 THEN now() ELSE now() - interval '1 minute' END`, recent); err != nil {
		t.Fatal(err)
	}
	o.env["DATABASE_URL"] = pgtest.AsRole(t, o.env["DATABASE_URL"], "sendonce_relay")
	o.env["SMS_API_BASE"], o.env["SMS_API_ALLOW_INSECURE"], o.env["SMS_API_KEY"], o.env["SMS_API_IDEMPOTENT"] = hs.URL, "true", "resolve-key-1", "false"
	o.env["SMS_API_LOOKUP_SETTLE"] = "30s"
	status := func(id uuid.UUID) string {
		var s string
		if err := o.pool.QueryRow(context.Background(), `SELECT status FROM sms_outbox WHERE id = $1`, id).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	code, out, errOut := o.run(t, "resolve", "-all", "-dry-run")
	if code != 0 || !strings.Contains(out, "dry run") || status(once) != "unknown" {
		t.Fatalf("dry run: exit %d, %s %s; row %s", code, out, errOut, status(once))
	}
	code, out, errOut = o.run(t, "resolve", "-all")
	if code != 0 {
		t.Fatalf("resolve: exit %d\n%s\n%s", code, out, errOut)
	}
	t.Log(out)
	for id, want := range map[uuid.UUID]string{once: "delivered", never: "dead", twice: "unknown", recent: "unknown"} {
		if got := status(id); got != want {
			t.Errorf("row %s is %s, want %s", id, got, want)
		}
	}
	if !strings.Contains(out, "looked up 3 of 4 unknown rows: sent 0, delivered 1, undelivered 0, dead 1, still unknown 1, skipped 1") {
		t.Errorf("summary:\n%s", out)
	}
	var maybe bool
	if err := o.pool.QueryRow(context.Background(), `SELECT maybe_accepted FROM sms_outbox WHERE id = $1`, never).Scan(&maybe); err != nil || maybe {
		t.Errorf("the row the provider never got is still marked maybe accepted (%v)", err)
	}
	if code, out, _ := o.run(t, "trace", twice.String()); code != 0 || !strings.Contains(out, "receipts and lookups (1)") || !strings.Contains(out, "several") {
		t.Errorf("trace after resolve:\n%s", out)
	}
	if code, _, errOut := o.run(t, "resolve", "-id", once.String()); code != 1 || !strings.Contains(errOut, "is not unknown") {
		t.Errorf("resolve of a settled row: exit %d %s", code, errOut)
	}
	if code, _, _ := o.run(t, "resolve"); code != 2 {
		t.Errorf("resolve without -id or -all: exit %d, want 2", code)
	}
}

// An empty lookup settles a row dead only while the provider would still
// show what its first attempt sent: a row whose first attempt (the oldest
// call logged, of any generation; the insert when attempt 1 went unlogged)
// is older than SMS_API_LOOKUP_RETENTION (default 24h) stays unknown, with
// the reason. A lookup that finds the message still settles it.
func TestResolveLeavesRowsPastTheLookupRetention(t *testing.T) {
	t.Parallel()
	o := setupOps(t)
	ctx := context.Background()
	stub, err := smsstub.New(smsstub.Config{IgnoreKeys: true, APIKey: "resolve-key-2"})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(stub.Handler())
	t.Cleanup(func() { hs.Close(); _ = stub.Close() })
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := o.pool.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	// unknown makes an unknown row created created ago whose attempt 1
	// began first ago (its only logged call), as o.kill does.
	unknown := func(created, first time.Duration) uuid.UUID {
		id := o.kill(t, outbox.StatusUnknown, wire.ReasonAmbiguous)
		exec(`UPDATE sms_outbox SET created_at = now() - $2::interval, updated_at = now() - interval '1 minute' WHERE id = $1`, id, created)
		exec(`UPDATE sms_attempts SET started_at = now() - $2::interval, outcome = 'ambiguous' WHERE outbox_id = $1`, id, first)
		return id
	}
	old := unknown(25*time.Hour, 25*time.Hour)
	oldFound := unknown(25*time.Hour, 25*time.Hour)
	late := unknown(25*time.Hour, time.Hour) // waited in a backlog: its first attempt is recent
	unlogged := unknown(25*time.Hour, time.Hour)
	exec(`UPDATE sms_attempts SET attempt = 2 WHERE outbox_id = $1`, unlogged) // attempt 1 died mid-call, unlogged
	replayed := unknown(25*time.Hour, 25*time.Hour)
	exec(`UPDATE sms_attempts SET outcome = 'permanent' WHERE outbox_id = $1`, replayed)
	exec(`UPDATE sms_outbox SET publish_gen = 1, attempt_count = 1 WHERE id = $1`, replayed)
	exec(`INSERT INTO sms_attempts (outbox_id, attempt, started_at, outcome, sender) VALUES ($1, 1, now() - interval '1 hour', 'ambiguous', 'test')`, replayed)
	body, _ := json.Marshal(map[string]string{"to": "+15557654321", "body": "b", "reference": oldFound.String()})
	req, _ := http.NewRequest(http.MethodPost, hs.URL+"/v1/messages", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer resolve-key-2")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	o.env["DATABASE_URL"] = pgtest.AsRole(t, o.env["DATABASE_URL"], "sendonce_relay")
	o.env["SMS_API_BASE"], o.env["SMS_API_ALLOW_INSECURE"], o.env["SMS_API_KEY"], o.env["SMS_API_IDEMPOTENT"] = hs.URL, "true", "resolve-key-2", "false"
	o.env["SMS_API_LOOKUP_RETENTION"] = "1s"
	if code, _, errOut := o.run(t, "resolve", "-all"); code != 2 || !strings.Contains(errOut, "SMS_API_LOOKUP_RETENTION") {
		t.Fatalf("a retention shorter than the settle time: exit %d %s", code, errOut)
	}
	delete(o.env, "SMS_API_LOOKUP_RETENTION")
	code, out, errOut := o.run(t, "resolve", "-all")
	if code != 0 {
		t.Fatalf("resolve: exit %d\n%s\n%s", code, out, errOut)
	}
	t.Log(out)
	for id, want := range map[uuid.UUID]string{old: "unknown", oldFound: "sent", late: "dead", unlogged: "unknown", replayed: "unknown"} {
		var status, lastErr string
		if err := o.pool.QueryRow(ctx, `SELECT status, coalesce(last_error, '') FROM sms_outbox WHERE id = $1`, id).Scan(&status, &lastErr); err != nil {
			t.Fatal(err)
		}
		if status != want {
			t.Errorf("row %s is %s, want %s", id, status, want)
		}
		if want == "unknown" {
			if !strings.Contains(out, id.String()+"  lookup: the provider has no message for this reference, but the row's first attempt, 25h0m0s ago, is older") ||
				!strings.Contains(out, "older than the provider's lookup retention (24h0m0s): left unknown -> stays unknown (SMS_API_LOOKUP_RETENTION 24h0m0s)") {
				t.Errorf("row %s: no reason given:\n%s", id, out)
			}
			if !strings.Contains(lastErr, "is older than the provider's lookup retention (24h0m0s): left unknown") {
				t.Errorf("row %s: last error %q", id, lastErr)
			}
		}
	}
	if !strings.Contains(out, "looked up 5 of 5 unknown rows: sent 1, delivered 0, undelivered 0, dead 1, still unknown 3, skipped 0, past the lookup retention 3") {
		t.Errorf("summary:\n%s", out)
	}
	var none int
	if err := o.pool.QueryRow(ctx, `SELECT count(*) FROM sms_evidence WHERE outbox_id = $1 AND kind = 'lookup' AND result = 'none'`, old).Scan(&none); err != nil || none != 1 {
		t.Errorf("the empty lookup is recorded %d times (%v), want once", none, err)
	}
}
