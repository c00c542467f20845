package main

import (
	"context"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/deadletter"
	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testing/natscluster"
	"github.com/sendonce/sendonce/internal/testing/testkit"
)

func TestParseConfig(t *testing.T) {
	env := map[string]string{}
	getenv := testkit.EnvMap(env)
	c, err := parseConfig([]string{"-rows", "5000", "-seed", "7"}, getenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.rows != 5000 || c.seed != 7 || c.loadDuration != time.Minute || c.binDir != "bin/crash" {
		t.Fatalf("got %+v", c)
	}
	env["SOAK_ROWS"] = "100000"
	if c, err = parseConfig(nil, getenv, io.Discard); err != nil || c.rows != 100000 || c.loadDuration != 400*time.Second {
		t.Fatalf("SOAK_ROWS: %+v, %v", c, err)
	}
	_, err = parseConfig([]string{"-database-url", "postgres://postgres@127.0.0.1:5432/app?sslmode=disable"}, getenv, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "soak") {
		t.Fatalf("a database without soak in its name must be refused, got %v", err)
	}
	if c, err = parseConfig([]string{"-cluster", "-drill", "pg-failover"}, getenv, io.Discard); err != nil || !c.cluster || c.drill != "pg-failover" || c.drillAt != 0.4 {
		t.Fatalf("-cluster -drill: %+v, %v", c, err)
	}
	if _, err = parseConfig([]string{"-drill", "flood"}, getenv, io.Discard); err == nil {
		t.Fatal("an unknown drill was accepted")
	}
	// A failover at a provider without idempotency is run with lookups;
	// without them it would send rows twice by design.
	if _, err = parseConfig([]string{"-drill", "pg-failover", "-provider", "non-idempotent"}, getenv, io.Discard); err == nil || !strings.Contains(err.Error(), "-provider lookup") {
		t.Fatalf("-drill pg-failover -provider non-idempotent: %v", err)
	}
	if c, err = parseConfig([]string{"-drill", "pg-failover", "-provider", "lookup"}, getenv, io.Discard); err != nil || c.provider != providerLookup {
		t.Fatalf("-drill pg-failover -provider lookup: %+v, %v", c, err)
	}
	if c, err = parseConfig([]string{"-provider", "twilio"}, getenv, io.Discard); err != nil || c.provider != providerTwilio {
		t.Fatalf("-provider twilio: %+v, %v", c, err)
	}
}

// At Twilio the rows go to a pool of numbers: each number's list spans
// pages, never more than the adapter reads, and a tenth of the numbers
// end in 7 (undelivered).
func TestNumberPool(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ rows, numbers int }{
		{1, 10}, {1500, 10}, {2500, 10}, {2501, 20}, {5000, 20}, {100_000, 400}, {maxRows, 4000},
	} {
		if got := numberPool(tt.rows); got != tt.numbers {
			t.Errorf("numberPool(%d) = %d, want %d", tt.rows, got, tt.numbers)
		}
		l := &loader{numbers: numberPool(tt.rows)}
		per, sevens := map[string]int{}, 0
		for i := range tt.rows {
			n := l.phone(i)
			if per[n]++; per[n] == 1 && strings.HasSuffix(n, undeliveredSuffix) {
				sevens++
			}
		}
		most := 0
		for _, n := range per {
			most = max(most, n)
		}
		if most > rowsPerNumber || most > 100*provider.DefaultTwilioLookupPages {
			t.Errorf("%d rows: %d to one number", tt.rows, most)
		}
		if len(per) == tt.numbers && sevens*10 != len(per) {
			t.Errorf("%d rows: %d of %d numbers end in %s", tt.rows, sevens, len(per), undeliveredSuffix)
		}
	}
	if got := (&loader{}).phone(4321); got != phone(4321) {
		t.Errorf("without a pool, row 4321 goes to %s", got)
	}
}

func TestClusterFaultKinds(t *testing.T) {
	s := &soak{cfg: config{provider: providerIdempotent}}
	if got := s.kinds(); len(got) != len(faultKinds) {
		t.Fatalf("single-server kinds = %v", got)
	}
	s.cluster = &natscluster.Cluster{}
	got := s.kinds()
	for _, k := range got {
		if k == "broker_restart" {
			t.Fatal("broker_restart among the cluster's faults")
		}
	}
	if !slices.Contains(got, "nats_leader_kill") || !slices.Contains(got, "nats_node_store_loss") || len(got) != len(faultKinds)-1+len(clusterFaultKinds) {
		t.Fatalf("cluster kinds = %v", got)
	}
}

func TestLine(t *testing.T) {
	var f faultCounts
	f.add("sender_kill")
	f.add("db_cut")
	f.add("db_cut")
	r := &result{rows: 10, faults: f.summary(), sent: 9, dead: 1, dups: []badRow{{}}}
	got := r.line(9*time.Minute + 12*time.Second + 300*time.Millisecond)
	want := "soak: rows 10; faults 3 (sender_kill 1, relay_kill 0, crashpoint 0, sender_term 0, broker_restart 0, lost_responses 0, burst_5xx 0, storm_429 0, provider_reset 0, db_cut 2, db_outage 0, rolling_restart 0); sent 9, dead 1, unknown 0; duplicates 1; dead but delivered 0; lost 0; wall 9m12s"
	if got != want {
		t.Fatalf("line:\n got %s\nwant %s", got, want)
	}
	if !r.failed() {
		t.Fatal("a duplicate must fail the soak")
	}
	if r := (&result{deadDelivered: []badRow{{}}}); !r.failed() {
		t.Fatal("a dead row the provider delivered must fail the soak")
	}
	if r := (&result{noLetter: []badRow{{}}}); !r.failed() {
		t.Fatal("a dead row without its dead letter must fail the soak")
	}
	if r := (&result{deadEarly: []badRow{{}}}); !r.failed() {
		t.Fatal("a row dead for max_attempts with attempts left must fail the soak")
	}
	if r := (&result{unknownForbidden: []badRow{{}}}); !r.failed() {
		t.Fatal("an unknown row at a non-idempotent provider under faults that cannot make one must fail the soak")
	}
}

// At a provider without idempotency that the senders look up, the verdict
// counts each settled status and fails on a duplicate, on a row settled
// otherwise than the provider decided, on a receipt the receiver
// acknowledged but the row does not show, on an unknown row and on an
// unfinished one; a row left sent whose receipt the provider gave up on is
// counted, not failed.
func TestClassifyAtALookupProvider(t *testing.T) {
	t.Parallel()
	r := &result{lookups: true, deadReasons: map[string]int{}}
	lookup := func(status string, d smsstub.Delivery, ok bool) badRow {
		t.Helper()
		id := uuid.New()
		r.classify(id, dbRow{status: status, ref: d.ProviderID, maxAttempts: 8}, ok, d, true, providerLookup, false, false, false)
		var out badRow
		for _, b := range r.bad() {
			if b.id == id {
				out.why += b.why + "; "
			}
		}
		return out
	}
	good := []struct {
		status string
		d      smsstub.Delivery
	}{
		{"delivered", smsstub.Delivery{Deliveries: 1, ProviderID: "msg_1", Fate: "delivered", ReceiptAcked: true}},
		{"undelivered", smsstub.Delivery{Deliveries: 1, ProviderID: "msg_2", Fate: "undelivered", ReceiptAcked: true}},
		{"sent", smsstub.Delivery{Deliveries: 1, ProviderID: "msg_3", Fate: "delivered"}}, // its receipt given up
	}
	for _, g := range good {
		if b := lookup(g.status, g.d, true); b.why != "" {
			t.Fatalf("%s %+v: %s", g.status, g.d, b.why)
		}
	}
	if r.failed() {
		t.Fatal("settled rows fail the soak")
	}
	for _, tt := range []struct {
		status string
		d      smsstub.Delivery
		ok     bool
		want   string
	}{
		{"delivered", smsstub.Delivery{Deliveries: 2, ProviderID: "msg_4", Fate: "delivered", ReceiptAcked: true}, true, "delivered more than once"},
		{"delivered", smsstub.Delivery{Deliveries: 1, ProviderID: "msg_5", Fate: "undelivered", ReceiptAcked: true}, true, `delivered, but the provider decided "undelivered"`},
		{"sent", smsstub.Delivery{Deliveries: 1, ProviderID: "msg_6", Fate: "delivered", ReceiptAcked: true}, true, "acknowledged its delivered receipt"},
		{"delivered", smsstub.Delivery{}, true, "delivered but never delivered"},
		{"unknown", smsstub.Delivery{}, true, "lookups settle every unanswered attempt"},
		{"sending", smsstub.Delivery{Deliveries: 1}, true, "not terminal"},
		{"", smsstub.Delivery{}, false, "committed row is gone"},
	} {
		if b := lookup(tt.status, tt.d, tt.ok); !strings.Contains(b.why, tt.want) {
			t.Errorf("%s %+v: %q, want %q", tt.status, tt.d, b.why, tt.want)
		}
	}
	if !r.failed() {
		t.Fatal("bad rows do not fail the soak")
	}
	// A receipt an old primary took with it: counted, not failed; one
	// the promoted primary should hold fails as before.
	acked := smsstub.Delivery{Deliveries: 1, ProviderID: "msg_7", Fate: "delivered", ReceiptAcked: true}
	bad := len(r.bad())
	r.classify(uuid.New(), dbRow{status: "sent", ref: "msg_7", maxAttempts: 8}, true, acked, true, providerLookup, false, true, false)
	if len(r.bad()) != bad || r.receiptWithPrimary != 1 {
		t.Fatalf("a receipt lost with an old primary: %d bad rows (was %d), %d counted", len(r.bad()), bad, r.receiptWithPrimary)
	}
	r.sent--
	// Where the senders sweep overdue receipts, a row left sent whose fate
	// the provider decided fails, whatever became of its receipt; at
	// Twilio only one whose message id is known (the sweep matches by it).
	for _, tc := range []struct {
		provider, ref string
		fails         bool
	}{{providerLookup, "msg_8", true}, {providerTwilio, "SM8", true}, {providerTwilio, "", false}} {
		bad := len(r.bad())
		r.classify(uuid.New(), dbRow{status: "sent", ref: tc.ref, maxAttempts: 8}, true,
			smsstub.Delivery{Deliveries: 1, ProviderID: tc.ref, Fate: "delivered"}, true, tc.provider, false, true, true)
		r.sent--
		if got := len(r.bad()) > bad; got != tc.fails {
			t.Errorf("%s, ref %q: a sent row with its fate decided fails %v, want %v", tc.provider, tc.ref, got, tc.fails)
		}
	}
	r.receiptLost = r.receiptLost[:1]
	if r.delivered != 4 || r.undel != 1 || r.sent != 2 || r.unkn != 1 || len(r.dups) != 1 || len(r.wrongFate) != 1 || len(r.receiptLost) != 1 {
		t.Fatalf("counts %+v", r)
	}
	r.rows, r.faults = 10, "0 (sender_kill 0)"
	r.stats = smsstub.Stats{Lookups: 7, ReceiptsSent: 9, ReceiptsGivenUp: 1}
	want := "soak: rows 10; faults 0 (sender_kill 0); delivered 4, undelivered 1, sent 2, dead 0, unknown 1; duplicates 1; dead but delivered 0; wrong fate 1; receipts lost 1; lost 3; lookups 7, receipts 9 (given up 1); wall 1m0s"
	if got := r.line(time.Minute); got != want {
		t.Fatalf("line:\n got %s\nwant %s", got, want)
	}
}

// Without idempotency, the soak draws no fault that makes an outcome
// unknown by nature, so that any unknown row is sendonce's fault.
func TestKindsForANonIdempotentProvider(t *testing.T) {
	t.Parallel()
	got := strings.Join(kindsFor(providerNonIdempotent), ",")
	for _, k := range []string{"sender_kill", "crashpoint", "lost_responses", "provider_reset"} {
		if strings.Contains(got, k) {
			t.Errorf("non-idempotent soak draws %s", k)
		}
	}
	for _, k := range []string{"db_outage", "db_cut", "broker_restart", "relay_kill", "sender_term"} {
		if !strings.Contains(got, k) {
			t.Errorf("non-idempotent soak does not draw %s", k)
		}
	}
	if len(kindsFor(providerIdempotent)) != len(faultKinds) {
		t.Error("the idempotent soak does not draw every kind")
	}
	if got := kindsFor(providerLookup); len(got) != len(faultKinds)+2 || !slices.Contains(got, "pg_failover") || !slices.Contains(got, "receipts_lost") {
		t.Errorf("the soak with lookups draws %v, not every kind, pg_failover and receipts_lost", got)
	}
	if !slices.Equal(kindsFor(providerTwilio), kindsFor(providerLookup)) {
		t.Error("the soak at Twilio does not draw what the soak with lookups draws")
	}
	if slices.Contains(kindsFor(providerIdempotent), "pg_failover") {
		t.Error("the idempotent soak, on the shared server, draws pg_failover")
	}
}

// The composed faults come early in the first deck, so that a short run
// meets them.
func TestBringForward(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100 {
		deck := append([]string{}, kindsFor(providerLookup)...)
		rng.Shuffle(len(deck), func(i, j int) { deck[i], deck[j] = deck[j], deck[i] })
		bringForward(deck, earlyKinds, rng)
		for _, k := range earlyKinds {
			if i := slices.Index(deck, k); i < 0 || i >= len(deck)/3 {
				t.Fatalf("%s at %d of %v", k, i, deck)
			}
		}
		sorted := slices.Sorted(slices.Values(deck))
		if !slices.Equal(sorted, slices.Sorted(slices.Values(kindsFor(providerLookup)))) {
			t.Fatalf("the deck lost or doubled a kind: %v", deck)
		}
	}
}

func TestHelpers(t *testing.T) {
	if got, _ := hostPort("postgres://postgres@127.0.0.1/x", "5432"); got != "127.0.0.1:5432" {
		t.Fatalf("hostPort: %s", got)
	}
	if got := clock(61*time.Second + 600*time.Millisecond); got != "1:02" {
		t.Fatalf("clock: %s", got)
	}
	if phone(42) != "+15550000042" || body(42) != "soak message 42" {
		t.Fatal("row content")
	}
	if got := reasonOf("attempts exhausted (8 of 8)"); got != "attempts exhausted (# of #)" {
		t.Fatalf("reasonOf: %s", got)
	}
}

// The soak's dead-letter check reads the letters the senders published.
func TestLetteredRows(t *testing.T) {
	b, err := startBroker(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.stop)
	nc, err := nats.Connect(b.url())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	topo, err := streams.Default()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := topo.Ensure(ctx, js); err != nil {
		t.Fatal(err)
	}
	s := &soak{broker: b}
	if got, err := s.letteredRows(ctx); err != nil || len(got) != 0 {
		t.Fatalf("empty stream: %v, %v", got, err)
	}
	id := uuid.New()
	if _, err := (deadletter.Publisher{JetStream: js}).Publish(ctx, deadletter.Letter{OutboxID: id, Reason: "max_attempts", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	got, err := s.letteredRows(ctx)
	if err != nil || !got[id] || len(got) != 1 {
		t.Fatalf("lettered rows = %v, %v; want only %s", got, err, id)
	}
}

// docs/configuration.md lists every setting, generated from bind (make docs).
func TestSettingsDoc(t *testing.T) { testkit.SettingsDoc(t, "soak", bind) }
