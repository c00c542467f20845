package e2e

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"golang.org/x/crypto/bcrypt"

	"github.com/sendonce/sendonce/internal/console"
	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/testing/browsertest"
	"github.com/sendonce/sendonce/internal/testing/testkit"
)

// An operator in a real browser: logs in, reads the overview's counts
// (they match the table, delivered rows of the last hour included),
// filters the dead letters, replays one after its preview and
// confirmation, watches it go through the pipeline to delivered (the
// provider's receipt, through a real receiver), and reads its timeline,
// the receipt among the attempts. The console runs as the role sendonce_console;
// screenshots of each page go to SENDONCE_SCREENSHOTS (or the test's
// temporary directory).
func TestConsoleInABrowser(t *testing.T) {
	t.Parallel()
	b := browsertest.Start(t)
	e := setup(t, envOptions{stub: smsstub.Config{Faults: smsstub.Faults{FailRate: 1, FailStatus: 400, FailCode: 21211},
		Receipts: smsstub.Receipts{Secret: testReceiptSecret, Delay: time.Millisecond}}})
	rcv := e.startReceiver()
	e.startRelay(relay.Config{})
	e.startSender(senderOptions{receipts: rcv})

	// Three rows the provider refuses for good, then five it sends.
	refused := e.insert(3)
	for id, r := range e.waitTerminal(refused, time.Minute) {
		if r.status != outbox.StatusDead {
			t.Fatalf("row %s is %s, want dead", id, r.status)
		}
	}
	if err := e.stub.SetFaults(smsstub.Faults{}); err != nil {
		t.Fatal(err)
	}
	e.waitSettled(e.insert(5), time.Minute)
	// A sender stores the letter's sequence just after the status.
	testkit.WaitFor(t, 30*time.Second, "the dead rows' letters", func() bool {
		var n int
		err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM sms_outbox WHERE status = 'dead' AND letter_seq > 0`).Scan(&n)
		return err == nil && n == len(refused)
	})

	hash, err := bcrypt.GenerateFromPassword([]byte("operator password 1"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	con, err := console.New(console.Config{
		Pool: asRole(t, e.dbURL(), "sendonce_console"), JetStream: e.js,
		Users:  []console.User{{Name: "alice", Hash: hash, Role: console.RoleOperator}},
		Logger: slog.New(slog.NewJSONHandler(e.logs, nil)), Refresh: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(con.Handler())
	t.Cleanup(srv.Close)

	// Log in: the overview sends the browser to the form first.
	b.Open(srv.URL + "/")
	b.Find(`input[name="username"]`).Type("alice")
	b.Find(`input[name="password"]`).Type("operator password 1")
	b.Screenshot("console-login")
	b.Find(`[data-action="login"]`).Click()

	// The overview's counts are the table's.
	b.Wait(`[data-status="delivered"]`, 10*time.Second)
	want := map[string]int{}
	rows, _ := e.pool.Query(context.Background(), `SELECT status, count(*) FROM sms_outbox GROUP BY status`)
	var st string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&st, &n}, func() error { want[st] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	for _, s := range outbox.ConsoleStatuses {
		got := b.Find(`[data-status="` + string(s) + `"]`).Text()
		if got != strconv.Itoa(want[string(s)]) {
			t.Errorf("overview: %s shows %q, the table has %d", s, got, want[string(s)])
		}
	}
	if want["dead"] != 3 || want["delivered"] != 5 {
		t.Fatalf("table %v, want 3 dead and 5 delivered", want)
	}
	// Every row changed in the last minutes: the last hour's and day's
	// counts are the table's too.
	for _, s := range []string{"delivered", "undelivered", "dead"} {
		for _, window := range []string{"hour", "day"} {
			if got := b.Find(`[data-` + window + `="` + s + `"]`).Text(); got != strconv.Itoa(want[s]) {
				t.Errorf("overview: %s in the last %s shows %q, the table has %d", s, window, got, want[s])
			}
		}
	}
	b.Screenshot("console-overview")

	// Filter the dead letters: by a reason none has, then by theirs.
	b.Open(srv.URL + "/dead-letters?reason=ambiguous")
	if n := len(b.FindAll("tr[data-id]")); n != 0 {
		t.Fatalf("%d dead letters with reason ambiguous, want 0", n)
	}
	b.Find(`select[name="reason"] option[value="permanent"]`).Click()
	b.Find(`[data-action="filter"]`).Click()
	testkit.WaitFor(t, 10*time.Second, "the filtered dead letters", func() bool {
		return strings.Contains(b.URL(), "reason=permanent") && len(b.FindAll("tr[data-id]")) == len(refused)
	})
	if code := b.Find(`tr[data-code="21211"] td.n`).Text(); code != "3" {
		t.Errorf("provider code 21211 counts %q rows, want 3", code)
	}
	target := refused[0]
	box := b.Find(`input[name="id"][value="` + target.String() + `"]`)
	box.Click()
	if !box.Selected() {
		t.Fatal("the checkbox is not selected")
	}
	b.Screenshot("console-dead-letters")

	// Preview: nothing changes until the confirmation.
	b.Find(`[data-action="replay-preview"]`).Click()
	confirm := b.Wait(`[data-action="replay-confirm"]`, 10*time.Second)
	if got := b.Find(`[data-field="would-replay"]`).Text(); got != "1" {
		t.Fatalf("the preview would replay %q rows, want 1", got)
	}
	if r := e.row(target); r.status != outbox.StatusDead {
		t.Fatalf("after the preview the row is %s", r.status)
	}
	b.Screenshot("console-replay-preview")
	confirm.Click()
	if got := b.Wait(`[data-field="replayed"]`, 10*time.Second).Text(); got != "1" {
		t.Fatalf("replayed %q rows, want 1", got)
	}
	b.Screenshot("console-replayed")

	// The pipeline sends it, once, and the provider's receipt settles it.
	rs := e.waitSettled([]uuid.UUID{target}, time.Minute)
	if rs[target].status != outbox.StatusDelivered {
		t.Fatalf("the replayed row ended %s, want delivered", rs[target].status)
	}
	if d := e.stub.Deliveries()[target.String()].Deliveries; d != 1 {
		t.Fatalf("the replayed row was delivered %d times", d)
	}
	for _, id := range refused[1:] {
		if r := e.row(id); r.status != outbox.StatusDead {
			t.Errorf("unselected row %s is %s", id, r.status)
		}
	}

	// Its timeline: created, the refused attempt, the letter, the replay,
	// the attempt that sent it, the receipt after it; never the number or
	// the body.
	b.Open(srv.URL + "/messages/" + target.String())
	if got := b.Find(`[data-field="status"]`).Text(); got != "delivered" {
		t.Fatalf("the message page says %q, want delivered", got)
	}
	var order []string
	kinds := map[string]int{}
	for _, li := range b.FindAll(`[data-section="receipts"] ol.timeline li`) {
		k := li.Attr("data-event")
		kinds[k]++
		order = append(order, k)
	}
	if kinds["created"] != 1 || kinds["attempt"] != 2 || kinds["letter"] != 1 || kinds["replay"] != 1 || kinds["receipt"] != 1 || kinds["status"] != 1 {
		t.Errorf("timeline events %v", kinds)
	}
	if n := len(order); n < 3 || order[n-3] != "attempt" || order[n-2] != "receipt" {
		t.Errorf("timeline order %v: want the receipt after the last attempt", order)
	}
	if r := b.Find(`li[data-event="receipt"]`).Attr("data-result"); r != "delivered" {
		t.Errorf("the receipt's result is %q, want delivered", r)
	}
	text := b.Find("main").Text()
	if strings.Contains(text, testPhone(0)) || strings.Contains(text, testBody(0)) {
		t.Error("the message page shows the number or the body")
	}
	b.Screenshot("console-message")
	e.checkLogs(refused)
}
