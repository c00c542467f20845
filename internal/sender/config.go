package sender

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sendonce/sendonce/internal/streams"
	"github.com/sendonce/sendonce/internal/tracing"
)

// Defaults of Config, exported so that the command's flags show the same.
const (
	DefaultConcurrency     = 32
	DefaultWriteBatch      = 256
	DefaultClaimLinger     = 2 * time.Millisecond
	DefaultWriteLinger     = 2 * time.Millisecond
	DefaultRetryBase       = 500 * time.Millisecond
	DefaultRetryCap        = 60 * time.Second
	DefaultMaxNakDelay     = 30 * time.Second
	DefaultDBTimeout       = 10 * time.Second
	DefaultPublishTimeout  = 10 * time.Second
	DefaultShutdownTimeout = 30 * time.Second
	DefaultNormalMinShare  = 0.2
	DefaultBulkMinShare    = 0.05
	DefaultLookupSettle    = 10 * time.Second
	DefaultLookupBudget    = 10
)

// Config configures a Sender.
type Config struct {
	// Pool is the database pool; required.
	Pool *pgxpool.Pool
	// JetStream consumes and publishes dead letters; required.
	JetStream jetstream.JetStream
	// Provider sends; required unless Routes are given.
	Provider Provider
	// Routes, when set, are the providers in order of preference
	// (SMS_PROVIDERS), each with a name: a row goes to the first whose
	// circuit takes calls, stays with it once an attempt may have reached
	// it, and moves on only when its attempts there certainly did not.
	// Provider is then the first's.
	Routes []Route
	// LaneProviders names a preferred provider per priority lane (urgent,
	// normal, bulk) among Routes (SMS_LANE_PROVIDERS): a new message of
	// that lane goes there while its circuit takes calls, else where the
	// others go.
	LaneProviders map[string]string
	// Stream and Consumer name the durable pull consumer; default "SMS"
	// and "senders".
	Stream, Consumer string
	// DeadLetterSubject and DeadLetterStream receive dead letters; default
	// "sms.dlq" and "SMS_DLQ".
	DeadLetterSubject, DeadLetterStream string
	// Concurrency is the most provider calls in flight; default 32.
	Concurrency int
	// ClaimBatch is the most messages claimed in one database round trip;
	// default Concurrency. Each priority lane holds up to twice as many
	// messages, every one held by heartbeats, and fetches more when it
	// holds ClaimBatch or fewer.
	ClaimBatch int
	// ClaimLinger is how long a claim waits for busy slots to free up
	// while messages wait, to claim them in one batch rather than a few at
	// a time; default (zero) 2ms, and a negative value claims at once.
	// With no message waiting a claim never waits.
	ClaimLinger time.Duration
	// WriteBatch is the most status writes committed together; default 256.
	WriteBatch int
	// WriteLinger is how long a status write waits for the outcomes of
	// attempts still running, to commit them together; default (zero)
	// 2ms, a negative value writes at once. With no attempt running a write
	// never waits.
	WriteLinger time.Duration
	// Lease is how long a claimed row is held for its attempt, stamped in
	// the row by the database clock: a claim that finds a row sending under
	// a live lease backs off, one that finds the lease run out takes over.
	// It must exceed the provider timeout plus the status write; default
	// 2*provider timeout + 5s.
	Lease time.Duration
	// RetryBase and RetryCap shape the full-jitter backoff between attempts:
	// U(0, min(RetryCap, RetryBase*2^attempt)). Default 500ms and 60s.
	RetryBase, RetryCap time.Duration
	// MaxNakDelay is the longest retry wait kept in JetStream (a Nak with
	// delay holds one of the consumer's MaxAckPending slots all along); a
	// longer one (a long Retry-After) acks the message and parks the row in
	// Postgres, queued with its next_attempt_at, for the reconciler to
	// republish when due. Default 30s.
	MaxNakDelay time.Duration
	// DBTimeout bounds each database round trip; default 10s. A claim or a
	// status write that fails is tried again (with the same claim token,
	// or the same results) for as long as the process runs: what was
	// learned is never dropped for an outage.
	DBTimeout time.Duration
	// PublishTimeout bounds a dead letter's publication; default 10s.
	PublishTimeout time.Duration
	// ShutdownTimeout bounds how long Run, once its context is done, keeps
	// trying to finish what it holds (claims whose answer was lost, status
	// writes, dead letters) through an outage; default 30s.
	ShutdownTimeout time.Duration
	// NormalMinShare and BulkMinShare are the least parts of this sender's
	// work the normal and the bulk lane get while they have messages
	// waiting, however busy the lanes above them: urgent messages go first,
	// and bulk ones are delayed, never starved. Defaults 0.2 and 0.05;
	// their sum must stay below 1.
	NormalMinShare, BulkMinShare float64
	// LookupSettle is how long after an attempt that got no answer, at a
	// provider without idempotency that can be looked up, the provider is
	// asked whether it has the message; default 10s. It rests on one
	// assumption: a request the provider accepted shows in its lookup
	// within this time. It must not exceed two thirds of the consumers'
	// ack wait (Run refuses to start otherwise): a dead sender's message
	// comes back that long after its last call at the least, and is looked
	// up at once. LookupBudget is how many lookups may fail before the row
	// ends unknown; default 10 (they are spaced by the backoff, at least
	// LookupSettle apart).
	LookupSettle time.Duration
	LookupBudget int
	// LookupRetention is how long the provider keeps a message visible to
	// lookups (SMS_API_LOOKUP_RETENTION): a lookup that finds nothing for a
	// row older than this proves nothing, and the row ends unknown rather
	// than be sent again. Zero trusts every answer.
	LookupRetention time.Duration
	// Flow, when set, paces provider requests within a rate limit shared by
	// every sender and pauses them all when the provider asks; a token is
	// taken before a row is claimed, so a wait spends no attempt. Nil sends
	// as fast as the slots allow and backs off per message.
	Flow Flow
	// Name identifies this sender in the attempts log; default the host name.
	Name string
	// Logger receives the sender's logs; default slog.Default().
	Logger *slog.Logger
	// Registerer receives the sender's metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// Tracing continues the trace of each message whose headers carry a
	// traceparent: a span for its processing, its claim, each provider
	// request (with the HTTP client's transport from Tracing.Transport)
	// and its status write; nil traces nothing.
	Tracing *tracing.Tracing
}

func (c *Config) setDefaults() {
	if c.Name == "" {
		c.Name, _ = os.Hostname()
	}
	c.Stream = cmp.Or(c.Stream, streams.Stream)
	c.Consumer = cmp.Or(c.Consumer, streams.Consumer)
	c.DeadLetterSubject = cmp.Or(c.DeadLetterSubject, streams.SubjectDeadLetter)
	c.DeadLetterStream = cmp.Or(c.DeadLetterStream, streams.DeadLetterStream)
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	c.ClaimBatch = cmp.Or(c.ClaimBatch, c.Concurrency)
	c.WriteBatch = cmp.Or(c.WriteBatch, DefaultWriteBatch)
	c.ClaimLinger = cmp.Or(c.ClaimLinger, DefaultClaimLinger)
	c.WriteLinger = cmp.Or(c.WriteLinger, DefaultWriteLinger)
	if len(c.Routes) > 0 && c.Provider == nil {
		c.Provider = c.Routes[0].Provider
	}
	if c.Provider != nil {
		c.Lease = cmp.Or(c.Lease, 2*c.maxTimeout()+5*time.Second)
	}
	c.RetryBase = cmp.Or(c.RetryBase, DefaultRetryBase)
	c.RetryCap = cmp.Or(c.RetryCap, DefaultRetryCap)
	c.DBTimeout = cmp.Or(c.DBTimeout, DefaultDBTimeout)
	c.MaxNakDelay = cmp.Or(c.MaxNakDelay, DefaultMaxNakDelay)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, DefaultPublishTimeout)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, DefaultShutdownTimeout)
	c.NormalMinShare = cmp.Or(c.NormalMinShare, DefaultNormalMinShare)
	c.BulkMinShare = cmp.Or(c.BulkMinShare, DefaultBulkMinShare)
	c.LookupSettle = cmp.Or(c.LookupSettle, DefaultLookupSettle)
	c.LookupBudget = cmp.Or(c.LookupBudget, DefaultLookupBudget)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// maxTimeout is the longest provider timeout of the routes.
func (c *Config) maxTimeout() time.Duration {
	t := c.Provider.Timeout()
	for _, r := range c.Routes {
		if r.Provider != nil {
			t = max(t, r.Provider.Timeout())
		}
	}
	return t
}

func (c *Config) validate() error {
	names := map[string]bool{}
	for _, r := range c.Routes {
		switch {
		case r.Name == "" || r.Provider == nil:
			return errors.New("sender: every route needs a name and a provider")
		case names[r.Name]:
			return fmt.Errorf("sender: provider %q is named twice", r.Name)
		case r.Provider.CanLookup() && !r.Provider.Idempotent() && c.Lease <= 2*r.Provider.Timeout():
			return fmt.Errorf("sender: Lease %s must exceed twice the provider timeout %s of %s when lookups are on", c.Lease, r.Provider.Timeout(), r.Name)
		}
		names[r.Name] = true
	}
	for lane, p := range c.LaneProviders {
		switch {
		case !slices.ContainsFunc(streams.Lanes, func(l streams.Lane) bool { return l.Name == lane }):
			return fmt.Errorf("sender: LaneProviders: no lane %q (urgent, normal, bulk)", lane)
		case !names[p]:
			return fmt.Errorf("sender: LaneProviders: lane %s names provider %q, which is not among the routes", lane, p)
		}
	}
	switch {
	case c.Pool == nil:
		return errors.New("sender: Config.Pool is required")
	case c.JetStream == nil:
		return errors.New("sender: Config.JetStream is required")
	case c.Provider == nil:
		return errors.New("sender: Config.Provider is required")
	case c.Concurrency < 1 || c.Concurrency > 10000:
		return fmt.Errorf("sender: Concurrency %d is outside 1..10000", c.Concurrency)
	case c.ClaimBatch < 1:
		return fmt.Errorf("sender: ClaimBatch %d must be at least 1", c.ClaimBatch)
	case c.WriteBatch < 1:
		return fmt.Errorf("sender: WriteBatch %d must be at least 1", c.WriteBatch)
	case c.Lease <= c.maxTimeout():
		return fmt.Errorf("sender: Lease %s must exceed the provider timeout %s", c.Lease, c.maxTimeout())
	case c.Provider.CanLookup() && !c.Provider.Idempotent() && c.Lease <= 2*c.Provider.Timeout():
		// A lookup and the call after it run under one lease.
		return fmt.Errorf("sender: Lease %s must exceed twice the provider timeout %s when lookups are on", c.Lease, c.Provider.Timeout())
	case c.LookupRetention < 0:
		return fmt.Errorf("sender: LookupRetention %s must not be negative", c.LookupRetention)
	case c.LookupSettle < 0 || c.LookupBudget < 1:
		return fmt.Errorf("sender: LookupSettle %s must not be negative and LookupBudget %d must be at least 1", c.LookupSettle, c.LookupBudget)
	case c.RetryBase <= 0:
		return fmt.Errorf("sender: RetryBase %s must be positive", c.RetryBase)
	case c.RetryCap < c.RetryBase:
		return fmt.Errorf("sender: RetryCap %s is below RetryBase %s", c.RetryCap, c.RetryBase)
	case c.MaxNakDelay <= 0:
		return fmt.Errorf("sender: MaxNakDelay %s must be positive", c.MaxNakDelay)
	case c.NormalMinShare < 0 || c.BulkMinShare < 0 || c.NormalMinShare+c.BulkMinShare >= 1:
		return fmt.Errorf("sender: NormalMinShare %g and BulkMinShare %g must be at least 0 and add up to less than 1", c.NormalMinShare, c.BulkMinShare)
	case c.DBTimeout <= 0 || c.PublishTimeout <= 0 || c.ShutdownTimeout <= 0:
		return errors.New("sender: DBTimeout, PublishTimeout and ShutdownTimeout must be positive")
	}
	return nil
}
