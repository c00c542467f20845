package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sendonce/sendonce"
	"github.com/sendonce/sendonce/internal/migrate"
	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/testing/natstest"
	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/internal/testing/testkit"
	"github.com/sendonce/sendonce/internal/testing/testport"
	"github.com/sendonce/sendonce/outbox"
)

func TestBadConfigurationNamesTheSetting(t *testing.T) {
	t.Parallel()
	base := map[string]string{"DATABASE_URL": "postgres://postgres@127.0.0.1:5432/x"}
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"missing database url", map[string]string{"DATABASE_URL": ""}, nil, "DATABASE_URL"},
		{"batch size not a number", map[string]string{"RELAY_BATCH_SIZE": "lots"}, nil, "RELAY_BATCH_SIZE"},
		{"batch size out of range", map[string]string{"RELAY_BATCH_SIZE": "0"}, nil, "RELAY_BATCH_SIZE"},
		{"workers out of range", map[string]string{"RELAY_WORKERS": "0"}, nil, "RELAY_WORKERS"},
		{"poll interval not a duration", map[string]string{"RELAY_POLL_INTERVAL": "5"}, nil, "RELAY_POLL_INTERVAL"},
		{"poll interval too short", map[string]string{"RELAY_POLL_INTERVAL": "1ms"}, nil, "RELAY_POLL_INTERVAL"},
		{"nats url scheme", map[string]string{"NATS_URL": "http://127.0.0.1:4222"}, nil, "NATS_URL"},
		{"nats seed scheme", map[string]string{"NATS_URL": "nats://127.0.0.1:4222,http://127.0.0.1:4223"}, nil, "NATS_URL"},
		{"nats replicas even", map[string]string{"NATS_REPLICAS": "2"}, nil, "NATS_REPLICAS"},
		{"nats replicas too many", map[string]string{"NATS_REPLICAS": "7"}, nil, "NATS_REPLICAS"},
		{"log format", map[string]string{"LOG_FORMAT": "xml"}, nil, "LOG_FORMAT"},
		{"bad flag", nil, []string{"-publish-window", "-3"}, "-publish-window"},
		{"unknown flag", nil, []string{"-bogus"}, "bogus"},
		{"console without users", map[string]string{"CONSOLE_ADDR": "127.0.0.1:0"}, []string{"console"}, "`relay console user NAME ROLE` prints one"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{}
			for k, v := range base {
				env[k] = v
			}
			for k, v := range tt.env {
				env[k] = v
			}
			var out, errOut testkit.Buffer
			code := run(context.Background(), append([]string{"relay"}, tt.args...), testkit.EnvMap(env), &out, &errOut)
			if code != 2 || !strings.Contains(errOut.String(), tt.want) {
				t.Fatalf("exit %d, stderr %q; want exit 2 naming %s", code, errOut.String(), tt.want)
			}
		})
	}
}

func TestHelpListsEverySetting(t *testing.T) {
	t.Parallel()
	var out, errOut testkit.Buffer
	if code := run(context.Background(), []string{"relay", "-h"}, testkit.EnvMap(nil), &out, &errOut); code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, env := range []string{"DATABASE_URL", "NATS_URL", "HTTP_ADDR", "RELAY_BATCH_SIZE", "RELAY_WORKERS", "RELAY_PUBLISH_WINDOW",
		"RELAY_POLL_INTERVAL", "RELAY_ACK_TIMEOUT", "DB_TIMEOUT", "SHUTDOWN_TIMEOUT", "LOG_FORMAT", "LOG_LEVEL",
		"NATS_REPLICAS", "NATS_ENSURE_TOPOLOGY"} {
		if !strings.Contains(errOut.String(), env) {
			t.Errorf("-h does not list %s", env)
		}
	}
	for _, c := range commands() {
		if !strings.Contains(errOut.String(), "relay "+c.name+" ") {
			t.Errorf("-h does not list the command %s:\n%s", c.name, errOut.String())
		}
	}
	for _, name := range []string{"migrate", "dlq", "trace"} {
		if !strings.Contains(errOut.String(), "relay "+name+" ") {
			t.Errorf("-h does not list %s", name)
		}
	}
}

func TestUnknownCommandNamesTheCommands(t *testing.T) {
	t.Parallel()
	var out, errOut testkit.Buffer
	if code := run(context.Background(), []string{"relay", "setpu"}, testkit.EnvMap(nil), &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "migrate, setup, dlq, trace") {
		t.Fatalf("exit %d, stderr %q", code, errOut.String())
	}
}

func TestUnreachableDatabaseNamesTheSetting(t *testing.T) {
	t.Parallel()
	var out, errOut testkit.Buffer
	env := map[string]string{"DATABASE_URL": "postgres://postgres@127.0.0.1:1/none?connect_timeout=2", "HTTP_ADDR": "127.0.0.1:0"}
	if code := run(context.Background(), []string{"relay"}, testkit.EnvMap(env), &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "DATABASE_URL") {
		t.Fatalf("exit %d, stderr %q", code, errOut.String())
	}
}

func TestMigrateCreatesTheDatabaseAndIsIdempotent(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t)
	ctx := context.Background()
	// Drop it so that migrate has to create it.
	admin, err := pgx.Connect(ctx, pgtest.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := pgx.ParseConfig(url)
	if _, err := admin.Exec(ctx, "DROP DATABASE "+cfg.Database); err != nil {
		t.Fatal(err)
	}
	admin.Close(ctx)
	for i := range 2 {
		var out, errOut testkit.Buffer
		if code := run(ctx, []string{"relay", "migrate"}, testkit.EnvMap(map[string]string{"DATABASE_URL": url}), &out, &errOut); code != 0 {
			t.Fatalf("migrate run %d: exit %d: %s", i, code, errOut.String())
		}
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM sendonce_schema_migrations`).Scan(&n); err != nil || n == 0 {
		t.Fatalf("migrations recorded: %d, %v", n, err)
	}
}

// The relay binary's run, driven as main drives it: it creates the streams on
// a fresh server, relays rows, and exits 0 on cancellation.
func TestRunRelaysAndShutsDownCleanly(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	srv := natstest.Start(t) // no topology: the relay must create it
	env := map[string]string{"DATABASE_URL": url, "NATS_URL": srv.URL(), "HTTP_ADDR": "127.0.0.1:0", "RELAY_POLL_INTERVAL": "50ms"}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var out, errOut testkit.Buffer
	go func() { done <- run(ctx, []string{"relay"}, testkit.EnvMap(env), &out, &errOut) }()

	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	err = pgx.BeginFunc(context.Background(), conn, func(tx pgx.Tx) error {
		for range 20 {
			if _, err := outbox.Enqueue(context.Background(), tx, "+15551230000", "hello from the relay test"); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 30*time.Second, "20 rows queued", func() bool {
		var queued int
		_ = conn.QueryRow(context.Background(), `SELECT count(*) FROM sms_outbox WHERE status = 'queued'`).Scan(&queued)
		return queued == 20
	})
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("relay did not stop")
	}
	if strings.Contains(errOut.String(), "+15551230000") || strings.Contains(errOut.String(), "hello from the relay test") {
		t.Fatal("the relay logged a phone number or a body")
	}
}

// docs/configuration.md lists every setting, generated from bind (make docs).
func TestSettingsDoc(t *testing.T) {
	testkit.SettingsDoc(t, "relay", bind)
	testkit.SettingsDoc(t, "relay migrate", bindMigrate)
	testkit.SettingsDoc(t, "relay console", bindConsole)
	testkit.SettingsDoc(t, "relay resolve", bindResolve)
	testkit.SettingsDoc(t, "relay setup", bindSetup)
}

// A row must outlive every message that can name it: the work stream keeps
// messages for its max_age.
func TestRetentionMustCoverTheStreamsMaxAge(t *testing.T) {
	t.Parallel()
	topo, err := streams.Default()
	if err != nil {
		t.Fatal(err)
	}
	var maxAge time.Duration
	for _, sc := range topo.Streams {
		if sc.Name == streams.Stream {
			maxAge = sc.MaxAge
		}
	}
	if maxAge <= 0 {
		t.Fatal("the work stream has no max_age")
	}
	for _, tt := range []struct {
		retention time.Duration
		ok        bool
	}{{0, true}, {maxAge, true}, {2 * maxAge, true}, {maxAge - time.Hour, false}, {time.Hour, false}} {
		err := checkRetention(tt.retention, topo)
		if (err == nil) != tt.ok || (err != nil && !strings.Contains(err.Error(), "OUTBOX_RETENTION")) {
			t.Errorf("retention %s: %v", tt.retention, err)
		}
	}
}

// migrateTo applies the migrations up to and including version to the
// database at url.
func migrateTo(t *testing.T, url string, version int) {
	t.Helper()
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
	var upTo []migrate.Migration
	for _, m := range migs {
		if m.Version <= version {
			upTo = append(upTo, m)
		}
	}
	if _, err := migrate.Up(ctx, conn, upTo); err != nil {
		t.Fatal(err)
	}
}

// A relay of this release on a database that `relay migrate` of this
// release has not migrated yet refuses to start, and says which version it
// found and which it needs; `relay migrate` itself runs (it is how to fix it).
func TestRefusesASchemaOlderThanItNeeds(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t)
	migrateTo(t, url, 5)
	migs, _ := migrate.Load(sendonce.Migrations, "migrations")
	env := map[string]string{"DATABASE_URL": url, "NATS_URL": "nats://127.0.0.1:1", "HTTP_ADDR": "127.0.0.1:0"}
	var out, errOut testkit.Buffer
	code := run(context.Background(), []string{"relay"}, testkit.EnvMap(env), &out, &errOut)
	want := fmt.Sprintf("found version 5, need version %d", migrate.Latest(migs))
	if code != 1 || !strings.Contains(errOut.String(), want) {
		t.Fatalf("exit %d, stderr %q; want exit 1 saying %q", code, errOut.String(), want)
	}
	var mout, merr testkit.Buffer
	if code := run(context.Background(), []string{"relay", "migrate"}, testkit.EnvMap(env), &mout, &merr); code != 0 {
		t.Fatalf("migrate: exit %d: %s", code, merr.String())
	}
}

// `relay migrate -down` refuses a table with rows unless -force.
func TestMigrateDownNeedsForceOnATableWithRows(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ctx, tx, "+15551230000", "still needed")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	env := testkit.EnvMap(map[string]string{"DATABASE_URL": url})
	var out, errOut testkit.Buffer
	if code := run(ctx, []string{"relay", "migrate", "-down", "1"}, env, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "-force") {
		t.Fatalf("down without -force: exit %d, stderr %q", code, errOut.String())
	}
	var fout, ferr testkit.Buffer
	if code := run(ctx, []string{"relay", "migrate", "-down", "1", "-force"}, env, &fout, &ferr); code != 0 {
		t.Fatalf("down -force: exit %d, stderr %q", code, ferr.String())
	}
}

// get returns the status code and body of GET url (0 when unreachable).
func get(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A relay started while NATS is down waits for it, alive (/healthz 200) but
// not ready, instead of exiting into a crash loop; once NATS is up it
// creates the topology and relays.
func TestStartsWhileNATSIsDown(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	srv := natstest.Start(t)
	srv.Stop()
	base := "http://127.0.0.1:" + strconv.Itoa(testport.Reserve(t))
	env := map[string]string{"DATABASE_URL": url, "NATS_URL": srv.URL(), "HTTP_ADDR": strings.TrimPrefix(base, "http://"), "RELAY_POLL_INTERVAL": "50ms"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	var out, errOut testkit.Buffer
	go func() { done <- run(ctx, []string{"relay"}, testkit.EnvMap(env), &out, &errOut) }()
	testkit.WaitFor(t, 30*time.Second, "/healthz while NATS is down", func() bool { code, _ := get(base + "/healthz"); return code == 200 })
	if code, body := get(base + "/readyz"); code != 503 {
		t.Fatalf("/readyz without NATS = %d %q, want 503", code, body)
	}
	select {
	case code := <-done:
		t.Fatalf("relay exited %d while NATS was down: %s", code, errOut.String())
	default:
	}
	srv.Restart()
	testkit.WaitFor(t, 30*time.Second, "/readyz once NATS is up", func() bool { code, _ := get(base + "/readyz"); return code == 200 })
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
}

// Readiness comes from the relay's own batches, not from pinging the
// services: a relay whose role may not claim rows answers every ping (so
// the old /readyz said ready) but relays nothing, and is not ready.
func TestNotReadyWhenBatchesFail(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	srv := natstest.Start(t)
	base := "http://127.0.0.1:" + strconv.Itoa(testport.Reserve(t))
	// sendonce_app may read the schema version but not claim rows.
	env := map[string]string{"DATABASE_URL": url + "&options=-c%20role%3Dsendonce_app", "NATS_URL": srv.URL(), "HTTP_ADDR": strings.TrimPrefix(base, "http://"),
		"RELAY_POLL_INTERVAL": "50ms", "DB_TIMEOUT": "200ms", "RELAY_ACK_TIMEOUT": "200ms", "RECONCILE": "false", "OUTBOX_RETENTION": "0"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	var out, errOut testkit.Buffer
	go func() { done <- run(ctx, []string{"relay"}, testkit.EnvMap(env), &out, &errOut) }()
	testkit.WaitFor(t, 30*time.Second, "/readyz 503 naming the failing batches", func() bool {
		code, body := get(base + "/readyz")
		if code == 200 {
			t.Fatalf("/readyz = 200 while every batch fails; stderr: %s", errOut.String())
		}
		// A batch failed on the missing grant, and the log says why
		// /readyz answers "not ready" (its body says no more).
		logs := errOut.String()
		return code == 503 && body == "not ready\n" && strings.Contains(logs, "permission denied") &&
			strings.Contains(logs, "not ready") && strings.Contains(logs, "relay batch")
	})
	cancel()
	<-done
}

// NATS_REPLICAS against a topology the relay may not change: it warns about
// each difference at start-up and runs; asked to create three replicas on a
// single server, it stops naming NATS_REPLICAS.
func TestReplicasAtStartUp(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	srv := natstest.Start(t)
	srv.EnsureTopology(t) // one replica each
	env := map[string]string{"DATABASE_URL": url, "NATS_URL": srv.URL(), "HTTP_ADDR": "", "NATS_REPLICAS": "3", "NATS_ENSURE_TOPOLOGY": "false"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	var out, errOut testkit.Buffer
	go func() { done <- run(ctx, []string{"relay"}, testkit.EnvMap(env), &out, &errOut) }()
	testkit.WaitFor(t, 30*time.Second, "the relay to start", func() bool { return strings.Contains(errOut.String(), "relay started") })
	for _, want := range []string{"stream SMS has 1 replica, NATS_REPLICAS=3", "stream SMS_DLQ has 1 replica, NATS_REPLICAS=3", "consumer SMS/senders has 1 replica, NATS_REPLICAS=3"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("start-up did not report %q: %s", want, errOut.String())
		}
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}

	env["NATS_ENSURE_TOPOLOGY"] = "true"
	var errOut2 testkit.Buffer
	if code := run(context.Background(), []string{"relay"}, testkit.EnvMap(env), &out, &errOut2); code != 1 || !strings.Contains(errOut2.String(), "NATS_REPLICAS=3 needs a JetStream cluster") {
		t.Fatalf("exit %d, stderr %q; want exit 1 naming NATS_REPLICAS", code, errOut2.String())
	}
}
