// Command soak proves the pipeline under faults: it pushes many rows through
// two relays and three senders, running as subprocesses of the real
// binaries, while it injects faults at random, and checks that no message was
// delivered twice (I1) and none was lost (I2).
//
// Set-up: the database is dropped, recreated and migrated with
// "relay migrate"; an embedded NATS server with JetStream runs on a port
// fixed at start and a store in a temporary directory (so it can be stopped
// and restarted in place); the provider stub runs as a subprocess. Senders
// reach the stub, and relays and senders reach Postgres, through in-process
// toxiproxies, so the soak can reset and cut those connections.
//
// Load: a few writer goroutines enqueue the rows with outbox.Enqueue, 50 per
// transaction, spread over the load phase. Meanwhile one fault at a time,
// drawn at random from eleven kinds (SIGKILL of a sender or a relay, a crash
// point, SIGTERM of a sender, a broker restart, lost responses, a 5xx
// burst, a 429 storm, connection resets on the provider path, a cut of the
// database connections, a Postgres outage of 15-35 s), is injected every few
// seconds. With -provider non-idempotent the stub ignores keys and only the
// kinds that cannot make an outcome unknown by themselves are drawn. With
// -provider lookup the stub ignores keys too, but sends signed delivery
// receipts to a receiver (a sixth process) and the senders look an
// unanswered attempt up before anything else, so every kind is drawn, and
// a twelfth that composes with the lost answers: pg_failover. Postgres is
// then a primary and a streaming standby of the soak's own (initdb,
// pg_basebackup; see pg.go), each behind a proxy that the relays, senders
// and receiver reach through one multi-host DSN, so that the database
// faults still reach them. pg_failover withholds a quarter of the
// provider's answers (calls in flight), cuts the replication link, kills
// the primary 2s later and promotes the standby, as the failover drill
// does; then it makes a new standby of the promoted primary, so that the
// fault can come again. -provider twilio is the same at the stub's Twilio
// facade, through the senders' Twilio adapter (SMS_PROVIDER=twilio), whose
// lookups read every page of a number's messages: the rows go to a pool of
// numbers, ten per 2,500 rows, so that each number takes at most 250
// messages (3 pages of 100 at the end; the adapter's cap is 10 pages), and
// the status callbacks are signed with X-Twilio-Signature.
//
// End: every fault is restored, every process made to run, and the soak waits
// for every row to reach a terminal status. It then compares the rows with
// the stub's deliveries per idempotency key and prints one line to stdout:
//
//	soak: rows 5000; faults 21 (sender_kill 2, ...); sent 5000, dead 0, unknown 0; duplicates 0; dead but delivered 0; lost 0; wall 2m3s
//
// With -provider lookup (and twilio, which counts the pages of lists as
// "lookup pages") the line counts the settled statuses and the evidence,
// and a row whose status is not the stub's decision fails it:
//
//	soak: rows 5000; faults 21 (...); delivered 4490, undelivered 500, sent 10, dead 0, unknown 0; duplicates 0; dead but delivered 0; wrong fate 0; receipts lost 0; lost 0; lookups 310, receipts 5262 (given up 10); wall 2m3s
//
// After a pg_failover, what the old primaries took with them is not the
// pipeline's loss: inserts never replicated (the application's transaction
// is lost with them), status writes, and receipts the receiver wrote there
// only (their rows stay sent: counted, not failed). A second line says so:
//
//	pg_failover: 1 failovers; lost with the old primaries: 150 inserts (150 of them delivered before the crash), 58 status writes (...), of whose rows 0 were delivered twice; 58 receipts (44 of their rows left sent)
//
// With -cluster, NATS is a 3-node JetStream cluster of nats-server processes
// (bin/nats-server; NATS_REPLICAS=3, sync_interval always), and the broker
// restart gives way to four faults of a cluster: SIGKILL of the SMS leader,
// SIGKILL of the consumer leader, SIGTERM of a node, and a node's store
// deleted; each waits until every node is back and current.
//
// With -drill store-loss or -drill pg-failover, one scripted failure
// replaces the random faults, with the relays and senders on their default
// settings, and a second line times the recovery (see drill.go):
//
//	drill store-loss at 0:33: NATS restarted on an empty store with 1981 rows queued, ...; topology recreated after 500ms; ...
//
// Progress and fault events go to stderr. Exit status: 0 when no row was
// delivered twice and none was lost, 1 otherwise or when the soak could not
// run, 2 for a bad flag.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/url"
	"strings"
	"time"

	"github.com/sendonce/sendonce/internal/crashpoint"
	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/proc"
)

func main() { proc.Main(run) }

// config is the parsed command line.
type config struct {
	rows          int
	seed          int
	binDir        string
	databaseURL   string
	faultInterval time.Duration
	loadDuration  time.Duration
	drainTimeout  time.Duration
	writers       int
	keepLogs      bool
	holdOnFailure bool
	holdMax       time.Duration
	provider      string
	cluster       bool
	natsServer    string
	drill         string
	drillAt       float64
	drillShort    bool
	pgBin         string
}

// The provider modes of the soak.
const (
	// providerIdempotent: the stub honours Idempotency-Key; every fault kind.
	providerIdempotent = "idempotent"
	// providerNonIdempotent: the stub ignores keys (like most real SMS
	// APIs), and the soak draws only faults that cannot make an outcome
	// unknown by themselves (no sender killed mid-call, no lost or reset
	// responses): any row that ends unknown is then a fault of sendonce's
	// (an outage turned into a guess), and fails the soak.
	providerNonIdempotent = "non-idempotent"
	// providerLookup: the stub ignores keys and sends signed delivery
	// receipts; the senders look an unanswered attempt up before anything
	// else (SMS_API_LOOKUP=true) and name the receiver as callback_url.
	// Every fault kind is drawn, the ones that lose answers included:
	// lookups settle them. Every row must end as the stub decided it
	// (delivered or undelivered; sent while its receipt is not through),
	// delivered once, none unknown.
	providerLookup = "lookup"
	// providerTwilio: the stub's Twilio facade (never idempotent; a paged
	// list of each number's messages for lookups; status callbacks signed
	// with X-Twilio-Signature), the senders' Twilio adapter looking up
	// (SMS_PROVIDER=twilio, SMS_API_LOOKUP=true) and the receiver verifying
	// the callbacks (TWILIO_AUTH_TOKEN). The rows go to a pool of numbers
	// (numberPool) so that each number's list spans pages. Every fault
	// kind is drawn, pg_failover included, and the verdict is
	// providerLookup's.
	providerTwilio = "twilio"
	// providerFailover: two providers in the senders' SMS_PROVIDERS, the
	// generic API first (through the proxy the faults act on) and the
	// stub's Twilio facade second (reached directly), both without
	// idempotency, looked up and sending receipts. A primary refusing
	// connections moves new messages to the second; a lost answer keeps a
	// message where it went. One stub serves both, so a message sent
	// through both counts two deliveries. The verdict is providerLookup's.
	providerFailover = "failover"
	// providerPair: SMS_PROVIDERS=generic,twilio without lookups, the
	// generic API honouring keys (through the proxy the faults act on;
	// the stub's faults act on it alone) and the stub's Twilio facade
	// second (without idempotency, reached directly, answering normally). The routine operations (a rolling restart, a graceful
	// stop, a relay killed) and the provider's faults are drawn, not a
	// sender killed or the broker restarted (whose redeliveries look like
	// a claim a failover lost, which a provider that cannot be asked ends
	// unknown by design): any row that ends unknown fails the soak, and
	// so does a message sent through both.
	providerPair = "pair"
)

// twilioFrom is the senders' TWILIO_FROM with -provider twilio.
const twilioFrom = "+15559990000"

// rowsPerNumber is how many rows at most go to one number with -provider
// twilio: 2.5 pages of the list a lookup reads (100 messages a page), a
// quarter of the adapter's cap (10 pages), whatever -rows is.
const rowsPerNumber = 250

// numberPool is how many numbers the rows of a -provider twilio soak go
// to, row i to number i mod the pool: a multiple of ten, so that a tenth
// end in undeliveredSuffix, and as few as leave at most rowsPerNumber rows
// to one (20 numbers of 250 rows at -rows 5000, 400 at 100,000).
func numberPool(rows int) int {
	per10 := 10 * rowsPerNumber
	return 10 * ((rows + per10 - 1) / per10)
}

// receiptSecret signs the stub's receipts for the receiver (-provider
// lookup).
const receiptSecret = "soak-receipt-secret-0123456789abcdef"

// undeliveredSuffix: with -provider lookup, the stub reports messages to
// numbers ending in it undelivered (a tenth of the rows).
const undeliveredSuffix = "7"

// maxRows bounds -rows: phone numbers are +1555 and 7 digits of the row index.
const maxRows = 1_000_000

func bind(s *envflag.Set, c *config) {
	s.Int(&c.rows, "rows", "SOAK_ROWS", 100_000, 1, maxRows, "rows to push through the pipeline")
	s.Int(&c.seed, "seed", "SOAK_SEED", 0, 0, math.MaxInt, "seed of the fault schedule; 0 picks one (printed at start)")
	s.String(&c.binDir, "bin", "SOAK_BIN", "bin/crash", "directory holding the relay, sender and smsstub binaries, built with -tags "+crashpoint.Tag)
	s.String(&c.databaseURL, "database-url", "SOAK_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/sendonce_soak?sslmode=disable",
		"Postgres database for the soak: DROPPED and recreated at start (its name must contain \"soak\"); with a primary and a standby of the soak's own (-provider lookup or twilio, -drill pg-failover) only its name is used")
	s.URL(&c.databaseURL, "database-url", "postgres", "postgresql")
	s.Duration(&c.faultInterval, "fault-interval", "SOAK_FAULT_INTERVAL", 3*time.Second, 30*time.Millisecond, time.Hour,
		"longest pause between two faults; each pause is drawn from [interval/3, interval]")
	s.Duration(&c.loadDuration, "load-duration", "SOAK_LOAD_DURATION", 0, 0, 24*time.Hour,
		"spread the inserts (and the faults) over this long; 0: max(60s, rows/250 per second)")
	s.Duration(&c.drainTimeout, "drain-timeout", "SOAK_DRAIN_TIMEOUT", 10*time.Minute, 10*time.Second, 24*time.Hour,
		"after the load and the faults, how long every row may take to finish before the rest count as lost")
	s.Int(&c.writers, "writers", "SOAK_WRITERS", 4, 1, 64, "writer goroutines enqueueing rows")
	s.Bool(&c.keepLogs, "keep-logs", "SOAK_KEEP_LOGS", false, "keep the log directory after a successful run (it is always kept after a failure)")
	s.Bool(&c.holdOnFailure, "hold-on-failure", "SOAK_HOLD_ON_FAILURE", false,
		"on a duplicate or a loss, keep NATS, the stub and the processes running (print how to reach them) until SIGINT or -hold-max")
	s.Duration(&c.holdMax, "hold-max", "SOAK_HOLD_MAX", time.Hour, time.Second, 24*time.Hour, "longest hold with -hold-on-failure")
	s.Enum(&c.provider, "provider", "SOAK_PROVIDER", providerIdempotent, []string{providerIdempotent, providerNonIdempotent, providerLookup, providerTwilio, providerFailover, providerPair},
		"idempotent: the stub honours keys, every fault kind; non-idempotent: the stub ignores keys, only faults that cannot make an outcome unknown, and any unknown row fails the soak; "+
			"lookup: the stub ignores keys and sends signed receipts to a receiver, the senders look up (SMS_API_LOOKUP=true), every fault kind and Postgres failovers (a primary and a standby of the soak's own), and each row must end as the stub decided, delivered once, none unknown; "+
			"twilio: as lookup, at the stub's Twilio facade through the senders' Twilio adapter, with the rows sent to a pool of numbers (ten per 2,500 rows) whose lists of messages span pages; "+
			"failover: as lookup, with SMS_PROVIDERS=generic,twilio (the faults act on the first), and no message sent through both; "+
			"pair: SMS_PROVIDERS=generic,twilio without lookups, the first honouring keys, the routine operations and the provider's faults (no sender killed, no broker restart), any unknown row or message sent through both fails the soak")
	s.Bool(&c.cluster, "cluster", "SOAK_CLUSTER", false,
		"run NATS as a 3-node JetStream cluster of nats-server processes (NATS_REPLICAS=3, sync_interval always), with leader kills, node restarts and a node's store loss among the faults")
	s.String(&c.natsServer, "nats-server", "SOAK_NATS_SERVER", "", "nats-server binary for -cluster (default: nats-server in -bin, else beside the soak binary, where make build puts it)")
	s.Enum(&c.drill, "drill", "SOAK_DRILL", "none", []string{"none", "store-loss", "pg-failover"},
		"none, or instead of random faults one scripted failure with the binaries' default settings, timed: store-loss (NATS killed, its store deleted, restarted empty) or pg-failover (the Postgres primary crashes and a streaming standby is promoted)")
	s.Float(&c.drillAt, "drill-at", "SOAK_DRILL_AT", 0.4, 0.05, 0.95, "the drill's failure comes when this share of the rows is committed")
	s.Bool(&c.drillShort, "drill-short", "SOAK_DRILL_SHORT", false, "run the drill with the soak's short timings (provider timeout 1s, lease 3s, reconciler grace 40s) instead of the defaults: its outcome, not its recovery time, is what counts (the short drill of make test)")
	s.String(&c.pgBin, "pg-bin", "SOAK_PG_BIN", "", "PostgreSQL server binaries for the primary and standby of -drill pg-failover and of -provider lookup and twilio (default: the newest /usr/lib/postgresql/*/bin)")
	s.Check(func() error {
		u, err := url.Parse(c.databaseURL)
		if err != nil {
			return err
		}
		if name := strings.TrimPrefix(u.Path, "/"); !strings.Contains(name, "soak") {
			return fmt.Errorf("-database-url / SOAK_DATABASE_URL: database %q is dropped at start, so its name must contain \"soak\"", name)
		}
		if c.drill == "pg-failover" && c.provider == providerNonIdempotent {
			// A status write lost with the primary sends a row again at a
			// provider without idempotency unless the sender looks the
			// attempt up first: that is -provider lookup.
			return errors.New("-drill pg-failover with -provider non-idempotent would send rows twice by design (a status write lost with the primary, no lookup to find the message): use -provider lookup")
		}
		return nil
	})
}

func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	var c config
	s := envflag.New("soak", getenv, stderr)
	bind(s, &c)
	err := s.Parse(args)
	if c.drill == "none" {
		c.drill = ""
	}
	if err == nil && c.loadDuration == 0 {
		c.loadDuration = autoLoadDuration(c.rows)
	}
	return c, err
}

// autoLoadDuration spreads rows at 250 per second, over at least a minute.
func autoLoadDuration(rows int) time.Duration {
	return max(time.Minute, time.Duration(rows)*time.Second/250)
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	c, err := parseConfig(args[1:], getenv, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "soak: configuration: %v\n", err)
		return 2
	}
	if c.seed == 0 {
		c.seed = int(rand.Int64N(math.MaxInt32)) + 1
	}
	s := newSoak(c, stdout, stderr)
	failed, err := s.run(ctx)
	if err != nil {
		s.logf("error: %v", err)
		failed = true
	}
	if failed && c.holdOnFailure && ctx.Err() == nil && (s.broker != nil || s.cluster != nil) && s.stub != nil {
		s.hold(ctx)
	}
	s.cleanup(failed)
	if failed {
		return 1
	}
	return 0
}
