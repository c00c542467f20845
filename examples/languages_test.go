// Package examples holds the examples of applications in other languages
// than Go (examples/app is the Go one, a module of its own); its test runs
// each against a real, migrated database.
package examples

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/internal/testing/pgtest"
	"github.com/sendonce/sendonce/internal/testing/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// language is one example: how to run it, and how to tell that its
// interpreter and driver are installed.
type language struct {
	name  string
	run   []string // the interpreter and the script
	probe []string // exits 0 when the driver is installed
	how   string   // how to install what is missing
}

var languages = []language{
	{"python", []string{"/usr/bin/python3", "python/enqueue.py"}, []string{"/usr/bin/python3", "-c", "import psycopg"}, "apt-get install python3-psycopg"},
	{"node", []string{"node", "node/enqueue.js"}, []string{"node", "-e", "require('./node/node_modules/pg')"}, "npm ci --prefix examples/node"},
	{"ruby", []string{"ruby", "ruby/enqueue.rb"}, []string{"ruby", "-e", "require 'pg'"}, "apt-get install ruby-pg"},
}

var printed = regexp.MustCompile(`^enqueued ([0-9a-f-]{36}): pending\nkeyed ([0-9a-f-]{36}): created (true|false)\nfollow it: relay trace ([0-9a-f-]{36})\n$`)

// Each example writes, as a login of the application's role only, an
// urgent code and a keyed notice in one transaction, and reads the
// status back; run again with the same key, it writes no second notice
// and gets the first one's id. CI installs every interpreter and driver
// (.ci/run); elsewhere a missing one skips its language.
func TestOtherLanguagesEnqueue(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewMigrated(t)
	app := pgtest.AsRole(t, dsn, "sendonce_app")
	admin, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	for i, l := range languages {
		t.Run(l.name, func(t *testing.T) {
			probe := exec.Command(l.probe[0], l.probe[1:]...)
			if out, err := probe.CombinedOutput(); err != nil {
				if os.Getenv("CI") != "" {
					t.Fatalf("%s or its driver is missing (%s): %v\n%s", l.name, l.how, err, out)
				}
				t.Skipf("%s or its driver is missing (%s)", l.name, l.how)
			}
			to, key := fmt.Sprintf("+155512300%02d", i), "order:"+uuid.NewString()
			var keyed string
			for run, created := range []string{"true", "false"} {
				cmd := exec.Command(l.run[0], append(l.run[1:], to, key)...)
				cmd.Dir = "."
				cmd.Env = append(os.Environ(), "DATABASE_URL="+app)
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("run %d: %v\n%s", run, err, out)
				}
				m := printed.FindStringSubmatch(string(out))
				if m == nil || m[1] != m[4] || m[3] != created {
					t.Fatalf("run %d printed %q; want the code pending, the notice created %s, the trace command", run, out, created)
				}
				if run == 0 {
					keyed = m[2]
				} else if m[2] != keyed {
					t.Fatalf("the second run's notice is %s, want the first's %s: one message per key", m[2], keyed)
				}
				var prio int
				var status, body string
				if err := admin.QueryRow(context.Background(), `SELECT priority, status, body FROM sms_outbox WHERE id = $1`, m[1]).Scan(&prio, &status, &body); err != nil ||
					prio != 1 || status != "pending" || body != "Your code is 482901" {
					t.Fatalf("the code's row: priority %d, %s, %q, %v", prio, status, body, err)
				}
			}
			var notices int
			if err := admin.QueryRow(context.Background(), `SELECT count(*) FROM sms_outbox WHERE idempotency_key = $1`, key).Scan(&notices); err != nil || notices != 1 {
				t.Fatalf("%d rows for the key, %v; want 1", notices, err)
			}
		})
	}
}
