package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	store "github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/outbox"
)

// wholeNumber matches a phone number written out in an operator's output.
var wholeNumber = regexp.MustCompile(`\+?[0-9]{7,}`)

// noNumbers fails when out shows a number whole.
func noNumbers(t *testing.T, what, out string) {
	t.Helper()
	if m := wholeNumber.FindString(out); m != "" {
		t.Errorf("%s shows a number whole (%q):\n%s", what, m, out)
	}
}

// An operator adds numbers (with a reason, by the OS user or -by), lists
// the list a page at a time, checks a number, removes one (a reason
// required; who and why recorded); no output shows a number whole; the
// relay's own role can do all of it.
func TestSuppressCommands(t *testing.T) {
	t.Parallel()
	o := setupOps(t)
	o.env["DATABASE_URL"] = pgtest.AsRole(t, o.env["DATABASE_URL"], "sendonce_relay")
	code, out, errOut := o.run(t, "suppress", "add", "-reason", "complaint by email", "-by", "alice", "+15550001234", "+15550001235", "+15550001234")
	if code != 0 || !strings.Contains(out, "2 added, 0 already on the list") {
		t.Fatalf("add: %d %q %q", code, out, errOut)
	}
	if code, out, _ := o.run(t, "suppress", "add", "-reason", "again", "+15550001234"); code != 0 || !strings.Contains(out, "0 added, 1 already") {
		t.Errorf("add again: %d %q", code, out)
	}
	if code, _, errOut := o.run(t, "suppress", "add", "+15550001236"); code != 2 || !strings.Contains(errOut, "-reason is required") {
		t.Errorf("add without a reason: %d %q", code, errOut)
	}
	if code, _, errOut := o.run(t, "suppress", "add", "-reason", "x", "5550001236"); code != 2 || strings.Contains(errOut, "5550001236") {
		t.Errorf("add of a bad number: %d %q; want refused, naming its place only", code, errOut)
	}
	code, out, _ = o.run(t, "suppress", "list", "-limit", "1")
	if code != 0 || !strings.Contains(out, "+1********34") || !strings.Contains(out, "operator") || !strings.Contains(out, "alice") ||
		!strings.Contains(out, "complaint by email") || !strings.Contains(out, "more: the next page is -after 1") {
		t.Errorf("list page 1: %d\n%s", code, out)
	}
	noNumbers(t, "list", out)
	if code, out, _ := o.run(t, "suppress", "list", "-after", "1"); code != 0 || !strings.Contains(out, "+1********35") || strings.Contains(out, "more:") {
		t.Errorf("list page 2: %d\n%s", code, out)
	}
	code, out, _ = o.run(t, "suppress", "check", "+15550001234")
	if code != 0 || !strings.Contains(out, "is on the suppression list") || !strings.Contains(out, "operator complaint by email (by alice), since ") {
		t.Errorf("check: %d\n%s", code, out)
	}
	noNumbers(t, "check", out)
	if code, _, errOut := o.run(t, "suppress", "remove", "+15550001234"); code != 2 || !strings.Contains(errOut, "-reason is required") {
		t.Errorf("remove without a reason: %d %q", code, errOut)
	}
	if code, out, _ := o.run(t, "suppress", "remove", "-reason", "wrote in to resubscribe", "-by", "bob", "+15550001234"); code != 0 || !strings.Contains(out, "removed by bob") {
		t.Errorf("remove: %d %q", code, out)
	}
	code, out, _ = o.run(t, "suppress", "check", "+15550001234")
	if code != 0 || !strings.Contains(out, "is not on the suppression list") || !strings.Contains(out, "by bob (operator): wrote in to resubscribe") {
		t.Errorf("check after removal: %d\n%s", code, out)
	}
	noNumbers(t, "check", out)
}

// An import reads "number[,reason]" lines, skips a header and comments,
// adds the valid numbers in batches, names the bad lines by their number
// only, and run again adds nothing twice.
func TestSuppressImport(t *testing.T) {
	t.Parallel()
	o := setupOps(t)
	o.env["DATABASE_URL"] = pgtest.AsRole(t, o.env["DATABASE_URL"], "sendonce_relay")
	var b strings.Builder
	b.WriteString("number,reason\n# exported from the old platform\n")
	for i := range 25 {
		fmt.Fprintf(&b, "+1555100%04d", i)
		if i%2 == 0 {
			b.WriteString(",STOP at the old provider")
		}
		b.WriteString("\n")
	}
	b.WriteString("5551009999,no plus\n+1555100000x\n\n+15551000001\n")
	file := filepath.Join(t.TempDir(), "list.csv")
	if err := os.WriteFile(file, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := o.run(t, "suppress", "import", "-batch", "10", "-by", "carol", file)
	if code != 1 || !strings.Contains(out, "26 numbers read: 25 added, 1 already on the list; 2 lines refused") ||
		!strings.Contains(out, "on line 28, 29:") {
		t.Errorf("import: %d %q %q", code, out, errOut)
	}
	noNumbers(t, "import", out+errOut)
	code, out, _ = o.run(t, "suppress", "import", "-by", "carol", file)
	if !strings.Contains(out, "0 added, 26 already on the list") {
		t.Errorf("import again: %d %q", code, out)
	}
	var n, withReason int
	if err := o.pool.QueryRow(context.Background(), `SELECT count(*), count(*) FILTER (WHERE reason = 'STOP at the old provider')
		FROM sms_suppressions WHERE source = 'import' AND added_by = 'carol'`).Scan(&n, &withReason); err != nil || n != 25 || withReason != 13 {
		t.Errorf("%d imported, %d with their line's reason (%v); want 25 and 13", n, withReason, err)
	}
}

// relay trace of a row the claim ended suppressed says so, and from what
// source; so does that of a row whose number went on the list after it was
// sent.
func TestTraceShowsASuppression(t *testing.T) {
	t.Parallel()
	o := setupOps(t)
	ctx := context.Background()
	var id uuid.UUID
	if err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		var err error
		id, err = outbox.Enqueue(ctx, tx, "+15557654321", "the secret body")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.ApplyInbound(ctx, o.pool, store.Inbound{Number: "+15557654321", Provider: "twilio", Keyword: "STOP"}); err != nil {
		t.Fatal(err)
	}
	claims, err := store.ClaimForSend(ctx, o.pool, []uuid.UUID{id}, nil, time.Minute, uuid.New())
	if err != nil || claims[0].Result != store.Suppressed {
		t.Fatalf("claim: %+v, %v", claims, err)
	}
	code, out, errOut := o.run(t, "trace", id.String())
	if code != 0 {
		t.Fatalf("trace: %d %s", code, errOut)
	}
	for _, want := range []string{"status        suppressed", "source inbound twilio", "suppressed    never sent: the number is on the suppression list (inbound twilio STOP, since "} {
		if !strings.Contains(out, want) {
			t.Errorf("trace lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "5557654321") {
		t.Errorf("trace shows the number:\n%s", out)
	}
}

// A suppressed row is never replayed, even -force'd: the number's entry
// stands, and the refusal says so.
func TestReplayRefusesASuppressedRow(t *testing.T) {
	t.Parallel()
	o := setupOps(t)
	ctx := context.Background()
	var id uuid.UUID
	if err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		var err error
		id, err = outbox.Enqueue(ctx, tx, "+15557654322", "the secret body")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.ApplyInbound(ctx, o.pool, store.Inbound{Number: "+15557654322", Provider: "sinch", Keyword: "QUIT"}); err != nil {
		t.Fatal(err)
	}
	if claims, err := store.ClaimForSend(ctx, o.pool, []uuid.UUID{id}, nil, time.Minute, uuid.New()); err != nil || claims[0].Result != store.Suppressed {
		t.Fatalf("claim: %+v, %v", claims, err)
	}
	code, out, _ := o.run(t, "dlq", "replay", "-id", id.String(), "-force")
	if code == 0 || !strings.Contains(out, "refused: suppressed") || !strings.Contains(out, "never replayed") {
		t.Errorf("replay of a suppressed row: exit %d\n%s", code, out)
	}
	if st, _ := outbox.Status(ctx, o.pool, id); st.Status != outbox.StatusSuppressed {
		t.Errorf("the row is %s after the refused replay", st.Status)
	}
}
