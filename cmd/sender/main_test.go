package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce"
	"github.com/sendonce/sendonce/internal/migrate"
	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/smsstub"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testing/natstest"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/internal/testing/testkit"
	"github.com/sendonce/sendonce/internal/testing/testport"
	"github.com/sendonce/sendonce/outbox"
)

func TestBadConfigurationNamesTheSetting(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "nope")
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"missing database url", map[string]string{"DATABASE_URL": ""}, nil, "DATABASE_URL"},
		{"missing api base", map[string]string{"SMS_API_BASE": ""}, nil, "SMS_API_BASE"},
		{"api base not a url", map[string]string{"SMS_API_BASE": "provider.example"}, nil, "SMS_API_BASE"},
		{"timeout not a duration", map[string]string{"SMS_API_TIMEOUT": "ten"}, nil, "SMS_API_TIMEOUT"},
		{"timeout negative", map[string]string{"SMS_API_TIMEOUT": "-1s"}, nil, "SMS_API_TIMEOUT"},
		{"idempotent not a bool", map[string]string{"SMS_API_IDEMPOTENT": "maybe"}, nil, "SMS_API_IDEMPOTENT"},
		{"concurrency out of range", map[string]string{"SENDER_CONCURRENCY": "0"}, nil, "SENDER_CONCURRENCY"},
		{"cap below base", map[string]string{"RETRY_BASE": "2s", "RETRY_CAP": "1s"}, nil, "RETRY_CAP"},
		{"lease below timeout", map[string]string{"SENDER_LEASE": "5s", "SMS_API_TIMEOUT": "10s"}, nil, "SENDER_LEASE"},
		{"permanent codes", map[string]string{"SMS_PERMANENT_CODES": "21211,abc"}, nil, "SMS_PERMANENT_CODES"},
		{"nats replicas even", map[string]string{"NATS_REPLICAS": "4"}, nil, "NATS_REPLICAS"},
		{"key file missing", map[string]string{"SMS_API_KEY_FILE": missing}, nil, "SMS_API_KEY_FILE"},
		{"key and key file", map[string]string{"SMS_API_KEY": "k", "SMS_API_KEY_FILE": "/dev/null"}, nil, "SMS_API_KEY_FILE"},
		{"bad flag", nil, []string{"-concurrency", "x"}, "-concurrency"},
		{"http without allow insecure", map[string]string{"SMS_API_ALLOW_INSECURE": "false"}, nil, "https"},
		// Receipts carry the number and the status: not in clear.
		{"http receipts url", map[string]string{"RECEIPTS_PUBLIC_URL": "http://receiver.example:8088"}, nil, "RECEIPTS_ALLOW_INSECURE"},
		{"http loopback receipts url", map[string]string{"RECEIPTS_PUBLIC_URL": "http://127.0.0.1:8088"}, nil, "RECEIPTS_PUBLIC_URL"},
		{"receipt overdue too short", map[string]string{"SENDER_RECEIPT_OVERDUE": "30s"}, nil, "SENDER_RECEIPT_OVERDUE"},
		{"receipt overdue looks", map[string]string{"SENDER_RECEIPT_OVERDUE_LOOKS": "0"}, nil, "SENDER_RECEIPT_OVERDUE_LOOKS"},
		{"receipt overdue rate", map[string]string{"SENDER_RECEIPT_OVERDUE_RATE": "0"}, nil, "SENDER_RECEIPT_OVERDUE_RATE"},
		{"unknown provider in the list", map[string]string{"SMS_PROVIDERS": "generic,acme"}, nil, "SMS_PROVIDERS"},
		{"provider listed twice", map[string]string{"SMS_PROVIDERS": "generic,generic"}, nil, "SMS_PROVIDERS"},
		{"listed provider without credentials", map[string]string{"SMS_PROVIDERS": "generic,twilio"}, nil, "TWILIO_ACCOUNT_SID"},
		{"lane provider without a list", map[string]string{"SMS_LANE_PROVIDERS": "urgent=generic"}, nil, "SMS_LANE_PROVIDERS"},
		{"lane provider not listed", map[string]string{"SMS_PROVIDERS": "generic", "SMS_LANE_PROVIDERS": "urgent=twilio"}, nil, "SMS_LANE_PROVIDERS"},
		{"no such lane", map[string]string{"SMS_PROVIDERS": "generic", "SMS_LANE_PROVIDERS": "vip=generic"}, nil, "SMS_LANE_PROVIDERS"},
	}
	// Everything missing is named at once: three restarts were needed to
	// find three missing Twilio settings.
	for _, w := range []string{"TWILIO_ACCOUNT_SID", "TWILIO_AUTH_TOKEN", "TWILIO_FROM", "DATABASE_URL"} {
		tests = append(tests, struct {
			name string
			env  map[string]string
			args []string
			want string
		}{"twilio and no database, all named: " + w, map[string]string{"SMS_PROVIDER": "twilio", "DATABASE_URL": ""}, nil, w})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{"DATABASE_URL": "postgres://127.0.0.1:5432/x", "SMS_API_BASE": "http://127.0.0.1:9", "SMS_API_ALLOW_INSECURE": "true"}
			for k, v := range tt.env {
				env[k] = v
			}
			var out, errOut testkit.Buffer
			code := run(context.Background(), append([]string{"sender"}, tt.args...), testkit.EnvMap(env), &out, &errOut)
			if code != 2 || !strings.Contains(errOut.String(), tt.want) {
				t.Fatalf("exit %d, stderr %q; want exit 2 naming %s", code, errOut.String(), tt.want)
			}
		})
	}
}

func TestHelpListsSettingsWithoutSecrets(t *testing.T) {
	t.Parallel()
	var out, errOut testkit.Buffer
	env := map[string]string{"SMS_API_KEY": "super-secret-key"}
	if code := run(context.Background(), []string{"sender", "-h"}, testkit.EnvMap(env), &out, &errOut); code != 0 {
		t.Fatalf("exit %d", code)
	}
	help := errOut.String()
	for _, v := range []string{"DATABASE_URL", "NATS_URL", "HTTP_ADDR", "SMS_API_BASE", "SMS_API_KEY", "SMS_API_TIMEOUT",
		"SMS_API_IDEMPOTENT", "SENDER_CONCURRENCY", "SENDER_LEASE", "RETRY_BASE", "RETRY_CAP"} {
		if !strings.Contains(help, v) {
			t.Errorf("-h does not list %s", v)
		}
	}
	if strings.Contains(help, "super-secret-key") {
		t.Fatal("-h prints the API key")
	}
}

// The sender binary's run with a key from SMS_API_KEY_FILE, next to a relay:
// rows are sent once each, and SIGTERM-style cancellation exits 0 after the
// in-flight work is written.
func TestRunSendsAndShutsDownCleanly(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	srv := natstest.Start(t)
	stub, err := smsstub.New(smsstub.Config{APIKey: "file-key-7a1b", Faults: smsstub.Faults{Latency: 20 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(stub.Handler())
	t.Cleanup(hs.Close)
	keyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte("file-key-7a1b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"DATABASE_URL": url, "NATS_URL": srv.URL(), "HTTP_ADDR": "127.0.0.1:0",
		"SMS_API_BASE": hs.URL, "SMS_API_ALLOW_INSECURE": "true", "SMS_API_KEY_FILE": keyFile, "SMS_API_TIMEOUT": "5s",
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut testkit.Buffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"sender"}, testkit.EnvMap(env), &out, &errOut) }()

	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// The sender creates the topology; wait for the stream before relaying.
	_, js := srv.Connect(t)
	testkit.WaitFor(t, 30*time.Second, "the sender to create the stream", func() bool {
		_, err := js.Stream(context.Background(), streams.Stream)
		return err == nil
	})
	r, err := relay.New(relay.Config{Pool: pool, JetStream: js, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	rdone := make(chan error, 1)
	go func() { rdone <- r.Run(rctx) }()
	defer func() { rcancel(); <-rdone }()

	err = pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		for range 50 {
			if _, err := outbox.Enqueue(context.Background(), tx, "+15559870000", "hello from the sender test"); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 30*time.Second, "50 rows sent", func() bool {
		var sent int
		_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM sms_outbox WHERE status = 'sent'`).Scan(&sent)
		return sent == 50
	})
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("sender did not stop")
	}
	for key, d := range stub.Deliveries() {
		if d.Deliveries != 1 {
			t.Errorf("key %s delivered %d times", key, d.Deliveries)
		}
	}
	logs := errOut.String()
	for _, secret := range []string{"file-key-7a1b", "+15559870000", "hello from the sender test"} {
		if strings.Contains(logs, secret) {
			t.Errorf("logs contain %q", secret)
		}
	}
}

// The sender binary with receipts asked for and lookups on runs the receipt
// sweep: a row sent before it started whose receipt never came (the stub
// sends none here) is looked up and moved to its fate, and the lookup is
// recorded. Without RECEIPTS_PUBLIC_URL the same sender leaves it sent.
func TestRunLooksUpOverdueReceipts(t *testing.T) {
	t.Parallel()
	for _, receipts := range []bool{false, true} {
		t.Run(fmt.Sprintf("receipts %v", receipts), func(t *testing.T) {
			t.Parallel()
			url := pgtest.NewMigrated(t)
			srv := natstest.Start(t)
			stub, err := smsstub.New(smsstub.Config{Receipts: smsstub.Receipts{Delay: time.Millisecond}})
			if err != nil {
				t.Fatal(err)
			}
			hs := httptest.NewServer(stub.Handler())
			t.Cleanup(hs.Close)
			t.Cleanup(func() { _ = stub.Close() })
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			pool, err := pgxpool.New(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()

			// The message went out an hour and a half ago; no receipt came.
			const to, body = "+15559870011", "overdue receipt test"
			var id string
			if err := pool.QueryRow(ctx, `INSERT INTO sms_outbox (id, to_e164, body, status, attempt_count, updated_at)
				VALUES (gen_random_uuid(), $1, $2, 'sent', 1, now() - interval '90 minutes') RETURNING id::text`, to, body).Scan(&id); err != nil {
				t.Fatal(err)
			}
			client, err := provider.New(provider.Config{BaseURL: hs.URL, Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if o := client.Send(ctx, provider.Message{Key: id, To: to, Body: body}); o.Kind != provider.Sent {
				t.Fatalf("send: %+v", o)
			}

			env := map[string]string{
				"DATABASE_URL": url, "NATS_URL": srv.URL(), "HTTP_ADDR": "127.0.0.1:0",
				"SMS_API_BASE": hs.URL, "SMS_API_ALLOW_INSECURE": "true", "SMS_API_TIMEOUT": "5s",
				"SMS_API_LOOKUP": "true",
			}
			if receipts {
				env["RECEIPTS_PUBLIC_URL"], env["RECEIPTS_ALLOW_INSECURE"] = "http://127.0.0.1:1", "true"
			}
			var out, errOut testkit.Buffer
			done := make(chan int, 1)
			go func() {
				done <- run(ctx, []string{"sender", "-receipt-overdue", "1h"}, testkit.EnvMap(env), &out, &errOut)
			}()
			status := func() (s string, lookups int) {
				_ = pool.QueryRow(context.Background(), `SELECT status, (SELECT count(*) FROM sms_evidence WHERE outbox_id = o.id AND kind = 'lookup')
					FROM sms_outbox o WHERE id = $1`, id).Scan(&s, &lookups)
				return s, lookups
			}
			if receipts {
				testkit.WaitFor(t, 30*time.Second, "the overdue row settled", func() bool {
					s, n := status()
					return s == "delivered" && n == 1
				})
			} else {
				testkit.WaitFor(t, 30*time.Second, "the sender to start", func() bool {
					return strings.Contains(errOut.String(), "sender started")
				})
			}
			// The start-up line says whether the sweep runs.
			if want := fmt.Sprintf("receipt_sweep=%v", receipts); !strings.Contains(errOut.String(), want) &&
				!strings.Contains(errOut.String(), fmt.Sprintf(`"receipt_sweep":%v`, receipts)) {
				t.Errorf("the start-up line does not say %s: %s", want, errOut.String())
			}
			cancel()
			if code := <-done; code != 0 {
				t.Fatalf("exit %d: %s", code, errOut.String())
			}
			if s, n := status(); !receipts && (s != "sent" || n != 0 || stub.Stats().Lookups != 0) {
				t.Fatalf("without receipts asked for: the row is %s with %d lookups; want sent, never looked up", s, n)
			}
			for _, secret := range []string{to, body} {
				if strings.Contains(errOut.String(), secret) {
					t.Errorf("logs contain %q", secret)
				}
			}
		})
	}
}

// docs/configuration.md lists every setting, generated from bind (make docs).
func TestSettingsDoc(t *testing.T) { testkit.SettingsDoc(t, "sender", bind) }

// A sender of this release on a database not yet migrated to the version it
// needs refuses to start and says which version it found and needs (before,
// it started and failed every claim while /readyz said ready).
func TestRefusesASchemaOlderThanItNeeds(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	migs, err := migrate.Load(sendonce.Migrations, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := migrate.Up(ctx, conn, migs[:5]); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DATABASE_URL": url, "NATS_URL": "nats://127.0.0.1:1", "HTTP_ADDR": "127.0.0.1:0",
		"SMS_API_BASE": "http://127.0.0.1:9", "SMS_API_ALLOW_INSECURE": "true"}
	var out, errOut testkit.Buffer
	code := run(ctx, []string{"sender"}, testkit.EnvMap(env), &out, &errOut)
	want := fmt.Sprintf("found version 5, need version %d", migrate.Latest(migs))
	if code != 1 || !strings.Contains(errOut.String(), want) {
		t.Fatalf("exit %d, stderr %q; want exit 1 saying %q", code, errOut.String(), want)
	}
}

// A sender started while NATS is down waits for it, alive (/healthz 200)
// but not ready, instead of exiting into a crash loop; once NATS is up it
// creates the topology, consumes and is ready.
func TestStartsWhileNATSIsDown(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	srv := natstest.Start(t)
	srv.Stop()
	addr := "127.0.0.1:" + strconv.Itoa(testport.Reserve(t))
	env := map[string]string{"DATABASE_URL": url, "NATS_URL": srv.URL(), "HTTP_ADDR": addr,
		"SMS_API_BASE": "http://127.0.0.1:9", "SMS_API_ALLOW_INSECURE": "true"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	var out, errOut testkit.Buffer
	go func() { done <- run(ctx, []string{"sender"}, testkit.EnvMap(env), &out, &errOut) }()
	status := func(path string) int {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	alive := func(what string, path string, want int) {
		t.Helper()
		testkit.WaitFor(t, 30*time.Second, what, func() bool {
			select {
			case c := <-done:
				t.Fatalf("sender exited %d: %s", c, errOut.String())
			default:
			}
			return status(path) == want
		})
	}
	alive("/healthz while NATS is down", "/healthz", 200)
	if code := status("/readyz"); code != 503 {
		t.Fatalf("/readyz without NATS = %d, want 503", code)
	}
	srv.Restart()
	alive("/readyz once NATS is up", "/readyz", 200)
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
}

// Each weak combination of settings is named at start-up; a sound one
// says nothing.
func TestPromiseWarnings(t *testing.T) {
	t.Parallel()
	twilio := provider.Settings{Kind: "twilio", TwilioSID: "AC" + strings.Repeat("a", 32), TwilioToken: "token", TwilioFrom: "+15550001111",
		Timeout: time.Second, Idempotent: true}
	generic := provider.Settings{Kind: "generic", BaseURL: "https://sms.example.com", APIKey: "key", Timeout: time.Second, Idempotent: true}
	withReceipts := twilio
	withReceipts.ReceiptsURL = "https://receipts.example.com"
	keyless := generic
	keyless.APIKey = ""
	unkeyed := generic
	unkeyed.Idempotent = false
	for _, tt := range []struct {
		name    string
		s       provider.Settings
		idemSet bool
		want    []string
	}{
		{"twilio alone", twilio, false, []string{"twilio honours no Idempotency-Key and neither lookups"}},
		{"twilio with receipts", withReceipts, false, nil},
		{"twilio told it is idempotent", withReceipts, true, []string{"SMS_API_IDEMPOTENT is for the generic provider only; twilio's"}},
		{"generic", generic, true, nil},
		{"generic without a key over https", keyless, false, []string{"SMS_API_KEY is empty"}},
		{"generic without idempotency", unkeyed, false, []string{"generic honours no Idempotency-Key"}},
	} {
		provs, err := tt.s.Clients(1)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		got := promiseWarnings(tt.s, provs, tt.idemSet)
		if len(got) != len(tt.want) {
			t.Errorf("%s: warnings %q, want %d", tt.name, got, len(tt.want))
			continue
		}
		for i, w := range tt.want {
			if !strings.Contains(got[i], w) {
				t.Errorf("%s: warning %q, want it to say %q", tt.name, got[i], w)
			}
		}
	}
}
