package console_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sendonce/sendonce/internal/deadletter"
	"github.com/sendonce/sendonce/internal/wire"
)

// BenchmarkPages measures each page's time to first byte and weight on a
// large outbox: SENDONCE_CONSOLE_ROWS rows (default 1,000,000) spread over
// the last 7 days (the default retention), one attempt each, 0.1 % dead,
// 0.02 % unknown, a few in flight, and stored letters for the newest dead
// rows. As at a provider that sends receipts, most finished rows are
// delivered (0.5 % undelivered, a tenth still sent), each delivered or
// undelivered row with its receipt, and one row in a hundred with a lookup
// before it. Loading takes a few minutes; make console-bench runs it.
//
//	go test -run '^$' -bench BenchmarkPages -benchtime 20x ./internal/console/
func BenchmarkPages(b *testing.B) {
	n := 1_000_000
	if v := os.Getenv("SENDONCE_CONSOLE_ROWS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 10_000 {
			b.Fatalf("SENDONCE_CONSOLE_ROWS=%q: want a number of at least 10000", v)
		}
	}
	f := benchSetup(b, n)
	c, csrf := f.loginB(b)
	var dead, ref string
	if err := f.owner.QueryRow(context.Background(), `SELECT id::text FROM sms_outbox WHERE status = 'dead' AND letter_seq > 0 ORDER BY updated_at DESC LIMIT 1`).Scan(&dead); err != nil {
		b.Fatal(err)
	}
	if err := f.owner.QueryRow(context.Background(), `SELECT provider_ref FROM sms_outbox WHERE status = 'sent' ORDER BY updated_at LIMIT 1`).Scan(&ref); err != nil {
		b.Fatal(err)
	}
	var delivered string
	if err := f.owner.QueryRow(context.Background(), `SELECT outbox_id::text FROM sms_evidence WHERE kind = 'lookup' ORDER BY id DESC LIMIT 1`).Scan(&delivered); err != nil {
		b.Fatal(err)
	}
	pages := []struct {
		name, method, path string
		form               url.Values
	}{
		{"login", "GET", "/login", nil},
		{"overview", "GET", "/", nil},
		{"dead-letters", "GET", "/dead-letters", nil},
		{"dead-letters-7d-permanent", "GET", "/dead-letters?reason=permanent&since=7d", nil},
		{"message", "GET", "/messages/" + dead, nil},
		{"message-delivered", "GET", "/messages/" + delivered, nil},
		{"replay-preview", "POST", "/dead-letters/replay", url.Values{"csrf": {csrf}, "action": {"preview"}, "id": {dead}}},
		// Answered by a redirect to the message found.
		{"search-provider-ref", "GET", "/messages?q=" + url.QueryEscape(ref), nil},
		{"static-css", "GET", "/static/console.css", nil},
		{"static-js", "GET", "/static/console.js", nil},
	}
	for _, p := range pages {
		b.Run(p.name, func(b *testing.B) {
			var ttfb []time.Duration
			var size int
			for b.Loop() {
				var body io.Reader
				if p.form != nil {
					body = strings.NewReader(p.form.Encode())
				}
				req, _ := http.NewRequest(p.method, f.srv.URL+p.path, body)
				if p.form != nil {
					req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				}
				var start, first time.Time
				req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
					WroteRequest:         func(httptrace.WroteRequestInfo) { start = time.Now() },
					GotFirstResponseByte: func() { first = time.Now() },
				}))
				client := c
				if p.name == "login" {
					client = http.DefaultClient // no session: the form itself
				}
				res, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				data, err := io.ReadAll(res.Body)
				res.Body.Close()
				if err != nil || res.StatusCode >= 400 {
					b.Fatalf("%s %s: %s %v", p.method, p.path, res.Status, err)
				}
				size = len(data)
				ttfb = append(ttfb, first.Sub(start))
			}
			slices.Sort(ttfb)
			b.ReportMetric(float64(ttfb[len(ttfb)/2])/float64(time.Millisecond), "ms-ttfb-p50")
			b.ReportMetric(float64(ttfb[len(ttfb)*95/100])/float64(time.Millisecond), "ms-ttfb-p95")
			b.ReportMetric(float64(size), "bytes")
		})
	}
}

// benchSetup is setup for a benchmark, with n rows loaded.
func benchSetup(b *testing.B, n int) *fixture {
	b.Helper()
	f := setupTB(b)
	ctx := context.Background()
	start := time.Now()
	span := 7 * 24 * time.Hour
	if _, err := f.owner.Exec(ctx, `INSERT INTO sms_outbox (id, to_e164, body, status, attempt_count, created_at, updated_at,
			end_reason, letter_seq, provider_ref, last_error)
		SELECT gen_random_uuid(), '+1555' || lpad(i::text, 7, '0'), 'Your code is 482901. It expires in 10 minutes.', s,
			1, t - interval '2 seconds', t,
			CASE s WHEN 'dead' THEN 'permanent' WHEN 'unknown' THEN 'ambiguous' END,
			CASE WHEN s IN ('dead', 'unknown') THEN 0 END,
			CASE WHEN s IN ('sent', 'delivered', 'undelivered') THEN 'msg_' || md5(i::text) END,
			CASE s WHEN 'dead' THEN 'http 400, provider code 21211: invalid To' WHEN 'unknown' THEN 'attempts exhausted after an ambiguous answer' END
		FROM (SELECT i, now() - (i * $2::float8 / $1) * interval '1 second' AS t,
			CASE WHEN i % 1000 = 0 THEN 'dead' WHEN i % 5000 = 1 THEN 'unknown' WHEN i % 20000 = 2 THEN 'queued'
			     WHEN i % 50000 = 3 THEN 'sending' WHEN i < 20 THEN 'pending' WHEN i % 10 = 4 THEN 'sent'
			     WHEN i % 200 = 5 THEN 'undelivered' ELSE 'delivered' END AS s
		      FROM generate_series(1, $1) i) g`, n, span.Seconds()); err != nil {
		b.Fatal(err)
	}
	if _, err := f.owner.Exec(ctx, `INSERT INTO sms_attempts (outbox_id, attempt, started_at, latency_ms, outcome, http_status, provider_code, error, sender)
		SELECT id, 1, updated_at - interval '40 milliseconds', 40,
			CASE status WHEN 'dead' THEN 'permanent' WHEN 'unknown' THEN 'ambiguous' WHEN 'queued' THEN 'retry' ELSE 'sent' END,
			CASE status WHEN 'dead' THEN 400 WHEN 'unknown' THEN 0 WHEN 'queued' THEN 503 ELSE 201 END,
			CASE status WHEN 'dead' THEN 21211 END, last_error, 'bench'
		FROM sms_outbox WHERE status <> 'pending' ORDER BY updated_at`); err != nil {
		b.Fatal(err)
	}
	// A receipt for each delivered and undelivered row, a second after its
	// attempt; a lookup before it for one row in a hundred.
	if _, err := f.owner.Exec(ctx, `INSERT INTO sms_evidence (outbox_id, kind, result, provider_ref, code, detail, reported_at, received_at, source)
		SELECT id, k.kind, CASE k.kind WHEN 'lookup' THEN 'found' ELSE status END, provider_ref,
			CASE WHEN k.kind = 'receipt' AND status = 'undelivered' THEN 30003 END,
			CASE k.kind WHEN 'lookup' THEN 'lookup: the provider has the message (accepted)' END,
			CASE k.kind WHEN 'receipt' THEN updated_at - interval '1 second' END,
			updated_at - CASE k.kind WHEN 'lookup' THEN interval '1 second' ELSE interval '0' END,
			CASE k.kind WHEN 'lookup' THEN 'sender' ELSE 'generic' END
		FROM sms_outbox, LATERAL (SELECT 'lookup' AS kind WHERE get_byte(uuid_send(id), 0) < 3 UNION ALL SELECT 'receipt') k
		WHERE status IN ('delivered', 'undelivered') ORDER BY updated_at, k.kind`); err != nil {
		b.Fatal(err)
	}
	// Letters for the newest 200 dead rows, as the senders store them.
	rows, err := f.owner.Query(ctx, `SELECT id FROM sms_outbox WHERE status = 'dead' ORDER BY updated_at DESC LIMIT 200`)
	if err != nil {
		b.Fatal(err)
	}
	var ids []uuid.UUID
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			b.Fatal(err)
		}
		ids = append(ids, id)
	}
	rows.Close()
	for _, id := range ids {
		seq, err := deadletter.Publisher{JetStream: f.js}.Publish(ctx, deadletter.Letter{OutboxID: id, Reason: wire.ReasonPermanent,
			Attempts: 1, ProviderCode: 21211, Payload: wire.AppendEncode(nil, wire.Send{ID: id}), Idempotency: deadletter.ProviderIdempotent})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := f.owner.Exec(ctx, `UPDATE sms_outbox SET letter_seq = $2 WHERE id = $1`, id, int64(seq)); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := f.owner.Exec(ctx, `VACUUM ANALYZE sms_outbox`); err != nil {
		b.Fatal(err)
	}
	if _, err := f.owner.Exec(ctx, `VACUUM ANALYZE sms_attempts`); err != nil {
		b.Fatal(err)
	}
	if _, err := f.owner.Exec(ctx, `VACUUM ANALYZE sms_evidence`); err != nil {
		b.Fatal(err)
	}
	b.Logf("loaded %d rows and their attempts in %s", n, time.Since(start).Round(time.Second))
	return f
}

func (f *fixture) loginB(b *testing.B) (*http.Client, string) {
	b.Helper()
	return f.login("alice", operatorPassword)
}
