package receiver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sendonce/sendonce/internal/receiver"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/internal/testing/testkit"
	"github.com/sendonce/sendonce/internal/tracing"
)

func TestMain(m *testing.M) { testkit.Main(m) }

var secret = []byte("a-test-secret-of-32-bytes-length")

const twilioToken = "twilio-test-token"

type fixture struct {
	t     *testing.T
	admin *pgxpool.Pool
	srv   *httptest.Server
	reg   *prometheus.Registry
	now   time.Time
}

// start runs a receiver acting as the least-privilege sendonce_receiver
// role, behind a real HTTP server.
func start(t *testing.T, edit func(*receiver.Config)) *fixture {
	t.Helper()
	admin, dsn := pgtest.NewPool(t)
	pool, err := pgxpool.New(context.Background(), pgtest.AsRole(t, dsn, "sendonce_receiver"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	f := &fixture{t: t, admin: admin, reg: prometheus.NewRegistry(), now: time.Now()}
	cfg := receiver.Config{Pool: pool, Secrets: [][]byte{secret}, TwilioToken: twilioToken, Registerer: f.reg}
	if edit != nil {
		edit(&cfg)
	}
	rv, err := receiver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = rv.Run(ctx) }()
	f.srv = httptest.NewServer(rv.Handler())
	t.Cleanup(func() { f.srv.Close(); cancel(); <-done })
	return f
}

func (f *fixture) row(status string) uuid.UUID {
	f.t.Helper()
	id := uuid.New()
	reason := map[string]any{"unknown": "ambiguous", "dead": "permanent"}[status]
	// A row past pending was claimed for sending (attempt_count): a
	// receipt may only settle a row some provider was asked to send.
	if _, err := f.admin.Exec(context.Background(), `INSERT INTO sms_outbox (id, to_e164, body, status, end_reason, attempt_count)
		VALUES ($1, '+15551234567', 'Your code is 482901', $2, $3, CASE WHEN $2 = 'pending' THEN 0 ELSE 1 END)`, id, status, reason); err != nil {
		f.t.Fatal(err)
	}
	return id
}

func (f *fixture) status(id uuid.UUID) (string, string) {
	f.t.Helper()
	var st string
	var ref *string
	if err := f.admin.QueryRow(context.Background(), `SELECT status, provider_ref FROM sms_outbox WHERE id = $1`, id).Scan(&st, &ref); err != nil {
		f.t.Fatal(err)
	}
	if ref == nil {
		return st, ""
	}
	return st, *ref
}

func (f *fixture) evidence(id uuid.UUID) int {
	f.t.Helper()
	var n int
	if err := f.admin.QueryRow(context.Background(), `SELECT count(*) FROM sms_evidence WHERE outbox_id = $1`, id).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

func receiptBody(ref, status string) []byte {
	b, _ := json.Marshal(map[string]any{"id": "msg_" + ref[:8], "reference": ref, "status": status, "code": 30003, "at": time.Now().UTC().Format(time.RFC3339)})
	return b
}

// post sends a generic receipt with the signature header sig and returns
// the status code and the result the receiver answered.
func (f *fixture) post(body []byte, sig string) (int, string) {
	f.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/v1/receipts/generic", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if sig != "" {
		req.Header.Set(receiver.HeaderSignature, sig)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	var ans struct{ Result string }
	_ = json.NewDecoder(resp.Body).Decode(&ans)
	return resp.StatusCode, ans.Result
}

func (f *fixture) count(source, result string) float64 {
	f.t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		f.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "sendonce_receipts_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["source"] == source && labels["result"] == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return -1
}

// Generic receipts: applied once committed, repeated without a change, early
// (the row still sending) and for an unknown row; refused when forged,
// stale, oversize or malformed, and then nothing changes.
func TestGenericReceipts(t *testing.T) {
	t.Parallel()
	f := start(t, func(c *receiver.Config) { c.TwilioToken = "" })
	sending, unknown, dead, untouched := f.row("sending"), f.row("unknown"), f.row("dead"), f.row("sent")
	sign := func(b []byte) string { return receiver.SignGeneric(secret, b, time.Now()) }

	for _, tt := range []struct {
		name       string
		body       []byte
		sig        string
		code       int
		result     string
		wantStatus string
		id         uuid.UUID
	}{
		{"early: the row is still sending", receiptBody(sending.String(), "delivered"), "", 200, "applied", "delivered", sending},
		{"the same again", receiptBody(sending.String(), "delivered"), "", 200, "unchanged", "delivered", sending},
		{"older news after delivered", receiptBody(sending.String(), "undelivered"), "", 200, "unchanged", "delivered", sending},
		{"an unknown row is settled", receiptBody(unknown.String(), "undelivered"), "", 200, "settled_unknown", "undelivered", unknown},
		{"a dead row contradicted: it follows the receipt", receiptBody(dead.String(), "delivered"), "", 200, "contradicted", "delivered", dead},
		{"the contradiction again", receiptBody(dead.String(), "delivered"), "", 200, "unchanged", "delivered", dead},
		{"no such row", receiptBody(uuid.NewString(), "delivered"), "", 200, "unknown_reference", "", uuid.Nil},
		{"not a reference of ours", []byte(`{"id":"msg_1","reference":"order-17","status":"delivered"}`), "", 200, "unknown_reference", "", uuid.Nil},
		{"forged", receiptBody(untouched.String(), "undelivered"), receiver.SignGeneric([]byte("another-secret-of-32-bytes-long!"), receiptBody(untouched.String(), "undelivered"), time.Now()), 401, "", "sent", untouched},
		{"unsigned", receiptBody(untouched.String(), "undelivered"), "none", 401, "", "sent", untouched},
		{"stale", receiptBody(untouched.String(), "undelivered"), receiver.SignGeneric(secret, receiptBody(untouched.String(), "undelivered"), time.Now().Add(-301*time.Second)), 401, "", "sent", untouched},
		{"malformed", []byte(`{"reference":`), "", 400, "", "sent", untouched},
		{"an unknown status", []byte(`{"reference":"` + untouched.String() + `","status":"lost"}`), "", 400, "", "sent", untouched},
		{"oversize", append(receiptBody(untouched.String(), "undelivered"), bytes.Repeat([]byte(" "), receiver.MaxBody)...), "", 400, "", "sent", untouched},
	} {
		sig := tt.sig
		switch sig {
		case "":
			sig = sign(tt.body)
		case "none":
			sig = ""
		}
		code, result := f.post(tt.body, sig)
		if code != tt.code || (tt.result != "" && result != tt.result) {
			t.Errorf("%s: %d %q, want %d %q", tt.name, code, result, tt.code, tt.result)
		}
		if tt.id != uuid.Nil {
			if st, _ := f.status(tt.id); st != tt.wantStatus {
				t.Errorf("%s: row is %s, want %s", tt.name, st, tt.wantStatus)
			}
		}
	}
	if n := f.evidence(untouched); n != 0 {
		t.Errorf("refused receipts left %d evidence records", n)
	}
	if n := f.evidence(sending); n != 2 {
		t.Errorf("%d evidence records for the delivered row, want 2 (delivered once, the older undelivered)", n)
	}
	if _, ref := f.status(unknown); ref != "msg_"+unknown.String()[:8] {
		t.Errorf("the settled row's provider id = %q", ref)
	}
	if _, ref := f.status(dead); ref != "msg_"+dead.String()[:8] {
		t.Errorf("the contradicted row's provider id = %q", ref)
	}
	for result, want := range map[string]float64{"forged": 2, "stale": 1, "malformed": 2, "oversize": 1, "unknown_reference": 2, "settled_unknown": 1, "contradicted": 1} {
		if got := f.count("generic", result); got != want {
			t.Errorf("sendonce_receipts_total{generic,%s} = %v, want %v", result, got, want)
		}
	}
}

// Receipts that arrive together share a transaction: a burst of 400
// concurrent receipts takes far fewer commits than receipts.
func TestReceiptsAreWrittenInBatches(t *testing.T) {
	t.Parallel()
	f := start(t, func(c *receiver.Config) { c.TwilioToken, c.Window = "", 20*time.Millisecond })
	const n = 400
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = uuid.New()
	}
	rows := make([][]any, n)
	for i, id := range ids {
		rows[i] = []any{id, "+15551234567", "b", "sent"}
	}
	if _, err := f.admin.CopyFrom(context.Background(), pgx.Identifier{"sms_outbox"}, []string{"id", "to_e164", "body", "status"}, pgx.CopyFromRows(rows)); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 100)
	for _, id := range ids {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			b := receiptBody(id.String(), "delivered")
			if code, result := f.post(b, receiver.SignGeneric(secret, b, time.Now())); code != 200 || result != "applied" {
				t.Errorf("receipt: %d %q", code, result)
			}
		})
	}
	wg.Wait()
	var delivered int
	if err := f.admin.QueryRow(context.Background(), `SELECT count(*) FROM sms_outbox WHERE status = 'delivered'`).Scan(&delivered); err != nil {
		t.Fatal(err)
	}
	commits := counter(t, f.reg, "sendonce_receipt_commits_total")
	t.Logf("%d receipts in %v commits (%.3f commits per receipt)", n, commits, commits/n)
	if delivered != n || commits >= n/4 {
		t.Fatalf("%d rows delivered in %v commits; want %d in fewer than %d", delivered, commits, n, n/4)
	}
}

func counter(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// Twilio's documented examples of X-Twilio-Signature.
func TestTwilioSignatureExamples(t *testing.T) {
	t.Parallel()
	const token = "12345"
	params := url.Values{
		"CallSid": {"CA1234567890ABCDE"}, "Caller": {"+14158675309"}, "Digits": {"1234"},
		"From": {"+14158675309"}, "To": {"+18005551212"},
	}
	const u = "https://mycompany.com/myapp.php?foo=1&bar=2"
	if got := receiver.SignTwilio(token, u, params); got != "RSOYDt4T1cUTdK1PDd93/VVr8B8=" {
		t.Errorf("signature = %s, want RSOYDt4T1cUTdK1PDd93/VVr8B8=", got)
	}
	if err := receiver.VerifyTwilio(token, u, params, "RSOYDt4T1cUTdK1PDd93/VVr8B8="); err != nil {
		t.Errorf("verify the documented signature: %v", err)
	}
	params.Set("Digits", "1235")
	if err := receiver.VerifyTwilio(token, u, params, "RSOYDt4T1cUTdK1PDd93/VVr8B8="); err == nil {
		t.Error("a changed parameter verified")
	}
	// A repeated parameter: its distinct values, sorted.
	rep := url.Values{"Sid": {"CA123"}, "SidAccount": {"AC123"}, "Digits": {"5678", "1234", "1234"}}
	if got := receiver.SignTwilio(token, u, rep); got != "IK+Dwps556ElfBT0I3Rgjkr1wJU=" {
		t.Errorf("signature with a repeated parameter = %s, want IK+Dwps556ElfBT0I3Rgjkr1wJU=", got)
	}
}

// Twilio's status callback, signed over the URL Twilio called (the
// receiver's public URL and ?ref=<row id>) and the form.
func TestTwilioReceipts(t *testing.T) {
	t.Parallel()
	const public = "https://receipts.example.com"
	f := start(t, func(c *receiver.Config) { c.PublicURL, c.DefaultProvider = public, "twilio" })
	sent, queued, dead := f.row("sent"), f.row("sending"), f.row("dead")
	post := func(id uuid.UUID, form url.Values, sig string) (int, string) {
		path := "/v1/receipts/twilio?ref=" + id.String()
		if sig == "" {
			sig = receiver.SignTwilio(twilioToken, public+path, form)
		}
		req, _ := http.NewRequest(http.MethodPost, f.srv.URL+path, strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set(receiver.HeaderTwilioSignature, sig)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var ans struct{ Result string }
		_ = json.NewDecoder(resp.Body).Decode(&ans)
		return resp.StatusCode, ans.Result
	}
	form := func(status string) url.Values {
		return url.Values{"MessageSid": {"SM123"}, "MessageStatus": {status}, "AccountSid": {"AC1"}, "ErrorCode": {"30003"}}
	}
	for _, tt := range []struct {
		id     uuid.UUID
		status string
		sig    string
		code   int
		want   string
	}{
		{queued, "sent", "", 200, "sent"},
		{queued, "failed", "bm90IGEgc2lnbmF0dXJlIGF0IGFsbA==", 401, "sent"},
		{queued, "failed", "", 200, "undelivered"},
		{sent, "canceled", "", 200, "sent"},
		{sent, "delivered", "", 200, "delivered"},
		{sent, "queued", "", 200, "delivered"},
		// Twilio has a message sendonce recorded dead: the row follows.
		{dead, "sent", "", 200, "sent"},
	} {
		if code, result := post(tt.id, form(tt.status), tt.sig); code != tt.code {
			t.Errorf("%s: %d %q, want %d", tt.status, code, result, tt.code)
		}
		if st, ref := f.status(tt.id); st != tt.want || (st != "sent" && ref != "SM123") {
			t.Errorf("after %s: %s %q, want %s", tt.status, st, ref, tt.want)
		}
	}
	if got := f.count("twilio", "forged"); got != 1 {
		t.Errorf("forged twilio receipts counted %v, want 1", got)
	}
	if _, ref := f.status(dead); ref != "SM123" {
		t.Errorf("the contradicted row's provider id = %q, want SM123", ref)
	}
	if got := f.count("twilio", "contradicted"); got != 1 {
		t.Errorf("contradicted twilio receipts counted %v, want 1", got)
	}
}

// Bad settings stop New naming what is wrong.
func TestNewRefusesBadSettings(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	for _, tt := range []struct {
		cfg  receiver.Config
		want string
	}{
		{receiver.Config{Pool: pool}, "secret"},
		{receiver.Config{Pool: pool, Secrets: [][]byte{[]byte("short")}}, "16 bytes"},
		{receiver.Config{Pool: pool, TwilioToken: "t"}, "PublicURL"},
	} {
		if _, err := receiver.New(tt.cfg); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%+v) = %v, want an error naming %s", tt.cfg, err, tt.want)
		}
	}
}

// A receipt storm: receipts posted at a steady rate (SENDONCE_RECEIPT_RATE
// a second, default 5,000) by 200 concurrent clients for b.N receipts,
// each answered once committed. It reports the commits per receipt, the
// achieved rate and the answer's latency percentiles.
//
//	go test -run '^$' -bench BenchmarkReceiptStorm -benchtime 25000x ./internal/receiver/
func BenchmarkReceiptStorm(b *testing.B) {
	rate := 5000.0
	if v := os.Getenv("SENDONCE_RECEIPT_RATE"); v != "" {
		if _, err := fmt.Sscan(v, &rate); err != nil {
			b.Fatal(err)
		}
	}
	admin, dsn := pgtest.NewPool(b)
	pool, err := pgxpool.New(context.Background(), pgtest.AsRole(b, dsn, "sendonce_receiver"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	reg := prometheus.NewRegistry()
	rv, err := receiver.New(receiver.Config{Pool: pool, Secrets: [][]byte{secret}, Registerer: reg})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = rv.Run(ctx) }()
	srv := httptest.NewServer(rv.Handler())
	defer func() { srv.Close(); cancel(); <-done }()
	ids := make([]uuid.UUID, b.N)
	rows := make([][]any, b.N)
	for i := range ids {
		ids[i] = uuid.New()
		rows[i] = []any{ids[i], "+15551234567", "b", "sent"}
	}
	if _, err := admin.CopyFrom(context.Background(), pgx.Identifier{"sms_outbox"}, []string{"id", "to_e164", "body", "status"}, pgx.CopyFromRows(rows)); err != nil {
		b.Fatal(err)
	}
	bodies := make([][]byte, b.N)
	for i, id := range ids {
		bodies[i] = receiptBody(id.String(), "delivered")
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 200}}
	latencies := make([]time.Duration, b.N)
	var next atomic.Int64
	interval := time.Duration(float64(time.Second) / rate)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for range 200 {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= b.N {
					return
				}
				// Paced: receipt i leaves at start + i*interval.
				if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
					time.Sleep(d)
				}
				t0 := time.Now()
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/receipts/generic", bytes.NewReader(bodies[i]))
				req.Header.Set(receiver.HeaderSignature, receiver.SignGeneric(secret, bodies[i], t0))
				resp, err := client.Do(req)
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Errorf("receipt answered %d", resp.StatusCode)
					return
				}
				latencies[i] = time.Since(t0)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(latencies)
	commits := counter(b, reg, "sendonce_receipt_commits_total")
	b.ReportMetric(commits/float64(b.N), "commits/receipt")
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "receipts/s")
	b.ReportMetric(float64(latencies[b.N/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(latencies[b.N*99/100].Microseconds())/1000, "p99-ms")
}

// A receipt for a traced row makes a span of the receiver's, linked to the
// message's trace; one for an untraced row makes none. The receiver reads
// the row's traceparent as its own least-privilege role.
func TestAReceiptIsLinkedToItsMessagesTrace(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	f := start(t, func(c *receiver.Config) {
		c.TwilioToken = ""
		c.Tracing = tracing.New(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	})
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	traced, untraced := f.row("sent"), f.row("sent")
	if _, err := f.admin.Exec(context.Background(), `UPDATE sms_outbox SET traceparent = $2 WHERE id = $1`, traced, tp); err != nil {
		t.Fatal(err)
	}
	for _, id := range []uuid.UUID{traced, untraced} {
		body := receiptBody(id.String(), "delivered")
		if code, res := f.post(body, receiver.SignGeneric(secret, body, time.Now())); code != http.StatusOK || res != "applied" {
			t.Fatalf("receipt: %d %q", code, res)
		}
	}
	spans := rec.Ended()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want one, for the traced row's receipt", len(spans))
	}
	s := spans[0]
	msg, _ := tracing.Parse(tp)
	if s.Name() != "receipt generic" || len(s.Links()) != 1 || s.Links()[0].SpanContext.TraceID() != msg.TraceID() ||
		s.Links()[0].SpanContext.SpanID() != msg.SpanID() || s.SpanKind() != trace.SpanKindServer {
		t.Fatalf("span %q kind %v links %+v; want receipt generic, a server span linked to %s", s.Name(), s.SpanKind(), s.Links(), tp)
	}
	for _, kv := range s.Attributes() {
		if v := kv.Value.Emit(); strings.Contains(v, "5551234567") || strings.Contains(v, "482901") {
			t.Errorf("attribute %s holds the number or the body", kv.Key)
		}
	}
}
