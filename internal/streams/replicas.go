package streams

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/envflag"
)

// Settings are the topology settings of the relay and the sender.
type Settings struct {
	// Ensure creates or updates the streams and the consumer at start-up,
	// and recreates them when they are lost while the process runs; false
	// only checks that they exist (credentials without those permissions).
	// Default true.
	Ensure bool
	// Replicas is the number of copies of SMS, SMS_DLQ and the consumer on
	// a JetStream cluster: 1, 3 or 5. Default 1 (a single server).
	Replicas int
}

// Bind binds NATS_ENSURE_TOPOLOGY and NATS_REPLICAS to s, each with a flag.
func Bind(s *envflag.Set, c *Settings) {
	s.Bool(&c.Ensure, "nats-ensure-topology", "NATS_ENSURE_TOPOLOGY", true, "create or update the streams and consumer of nats/ at start-up, and recreate them if the broker loses them; false only checks they exist (for credentials without those permissions; run relay setup first)")
	BindReplicas(s, &c.Replicas)
}

// BindReplicas binds NATS_REPLICAS to s, with a flag.
func BindReplicas(s *envflag.Set, replicas *int) {
	s.Int(replicas, "nats-replicas", "NATS_REPLICAS", 1, 1, 5, "replicas of the streams SMS and SMS_DLQ and of the consumer: 1, or 3 or 5 on a JetStream cluster (needs nats-server >= 2.11, whose dedup survives a stream-leader change); an existing stream is scaled up in place, never down")
	s.Check(func() error {
		if err := ValidReplicas(*replicas); err != nil {
			return fmt.Errorf("-nats-replicas / NATS_REPLICAS: %w", err)
		}
		return nil
	})
}

// ValidReplicas refuses a replica count other than 1, 3 or 5: an even count
// tolerates no more failures than the odd one below it, and costs a copy.
func ValidReplicas(n int) error {
	switch n {
	case 1, 3, 5:
		return nil
	}
	return fmt.Errorf("%d replicas: want 1, 3 or 5", n)
}

// WithReplicas returns a copy of t whose streams keep n copies of their
// messages, and whose consumers n copies of their state. At 1 a consumer
// leaves its replicas to the server, which gives it its stream's.
func (t *Topology) WithReplicas(n int) (*Topology, error) {
	if err := ValidReplicas(n); err != nil {
		return nil, err
	}
	out := &Topology{
		Streams:   slices.Clone(t.Streams),
		Consumers: make(map[string][]jetstream.ConsumerConfig, len(t.Consumers)),
	}
	for i := range out.Streams {
		out.Streams[i].Replicas = n
	}
	for s, cs := range t.Consumers {
		cs = slices.Clone(cs)
		for i := range cs {
			cs[i].Replicas = 0
			if n > 1 {
				cs[i].Replicas = n
			}
		}
		out.Consumers[s] = cs
	}
	return out, nil
}

// ScaleUp raises the replicas of the named stream (one the topology does
// not declare: a key-value bucket's) to n in place, and never lowers them;
// it returns "updated (replicas 1 -> 3)", or "" when it had enough.
func ScaleUp(ctx context.Context, js jetstream.JetStream, name string, n int) (string, error) {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return "", fmt.Errorf("stream %s: look up: %w", name, err)
	}
	cfg := s.CachedInfo().Config
	have := max(cfg.Replicas, 1)
	if have >= n {
		return "", nil
	}
	cfg.Replicas = n
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return "", fmt.Errorf("stream %s: update: %w", name, replicasHint(err, n))
	}
	return fmt.Sprintf("updated (replicas %d -> %d)", have, n), nil
}

// replicas is the number of replicas t asks for (its first stream's).
func (t *Topology) replicas() int {
	if len(t.Streams) == 0 {
		return 1
	}
	return max(t.Streams[0].Replicas, 1)
}

// replicasHint names NATS_REPLICAS in an error the server gives when it
// cannot place the replicas asked for.
func replicasHint(err error, n int) error {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return err
	}
	switch apiErr.ErrorCode {
	case 10074: // replicas > 1 not supported in non-clustered mode
		return fmt.Errorf("NATS_REPLICAS=%d needs a JetStream cluster, and this server runs alone: %w", n, err)
	case 10005, 10023: // no suitable peers; insufficient resources
		return fmt.Errorf("NATS_REPLICAS=%d: the broker cannot place the stream (too few servers with JetStream for the replicas, or too little storage for its max_bytes): %w", n, err)
	}
	return err
}

// Verify checks that every stream and consumer of t exists, for a process
// that does not ensure the topology. It returns an error naming what is
// missing, and one line per difference in replicas from t's (a process
// reports them at start-up and runs on: the topology is someone else's).
func (t *Topology) Verify(ctx context.Context, js jetstream.JetStream) ([]string, error) {
	want := t.replicas()
	var diffs []string
	have := map[string]int{}
	for _, cfg := range t.Streams {
		s, err := js.Stream(ctx, cfg.Name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("stream %s is missing", cfg.Name)
		}
		if err != nil {
			return nil, fmt.Errorf("look up stream %s: %w", cfg.Name, err)
		}
		n := max(s.CachedInfo().Config.Replicas, 1)
		have[cfg.Name] = n
		if n != want {
			diffs = append(diffs, fmt.Sprintf("stream %s has %s, NATS_REPLICAS=%d", cfg.Name, plural(n, "replica"), want))
		}
	}
	for _, s := range slices.Sorted(maps.Keys(t.Consumers)) {
		for _, cfg := range t.Consumers[s] {
			c, err := js.Consumer(ctx, s, cfg.Durable)
			if errors.Is(err, jetstream.ErrConsumerNotFound) {
				return nil, fmt.Errorf("consumer %s/%s is missing", s, cfg.Durable)
			}
			if err != nil {
				return nil, fmt.Errorf("look up consumer %s/%s: %w", s, cfg.Durable, err)
			}
			n := c.CachedInfo().Config.Replicas
			if n == 0 {
				n = have[s] // follows its stream
			}
			if n != want {
				diffs = append(diffs, fmt.Sprintf("consumer %s/%s has %s, NATS_REPLICAS=%d", s, cfg.Durable, plural(n, "replica"), want))
			}
		}
	}
	return diffs, nil
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}

// DedupSafeVersion is the first nats-server release whose stream keeps its
// dedup state (the Nats-Msg-Id window) across a change of stream leader.
// Before it, a publication retried after a leader change could be stored
// twice; the senders' claim would still stop a second send, at the cost of
// a redundant delivery attempt.
const DedupSafeVersion = "2.11.0"

// MinServerVersion is the oldest nats-server the topology runs on: the
// senders' consumers each filter several subjects (a lane's, and sms.send
// from before lanes), which nats-server takes from 2.10 on.
const MinServerVersion = "2.10.0"

// CheckServerVersion refuses a server older than MinServerVersion, in one
// line that says what is needed and where to get it; an unreadable
// version passes (the server's own refusal then names the feature).
func CheckServerVersion(version string) error {
	if !versionBefore(version, MinServerVersion) {
		return nil
	}
	return fmt.Errorf("nats-server %s is too old: sendonce needs %s or newer (%s or newer for a cluster); `make build` builds one in bin/nats-server, or take a release from https://github.com/nats-io/nats-server/releases",
		version, strings.TrimSuffix(MinServerVersion, ".0"), strings.TrimSuffix(DedupSafeVersion, ".0"))
}

// VersionNote returns a warning when a server of version (as the server
// reports it, "2.10.22") runs replicated streams without the dedup fix,
// and "" otherwise.
func VersionNote(version string, replicas int) string {
	if replicas <= 1 || !versionBefore(version, DedupSafeVersion) {
		return ""
	}
	return fmt.Sprintf("nats-server %s is older than %s: with NATS_REPLICAS=%d a publication retried across a stream-leader change may be stored twice (the senders' claim still stops a second send); upgrade the cluster", version, DedupSafeVersion, replicas)
}

// versionBefore compares dotted versions numerically; an unreadable
// version counts as not before (no warning on a guess).
func versionBefore(v, than string) bool {
	a, ok1 := parseVersion(v)
	b, ok2 := parseVersion(than)
	if !ok1 || !ok2 {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}

func parseVersion(v string) ([3]int, bool) {
	var out [3]int
	v = strings.TrimPrefix(v, "v")
	v, _, _ = strings.Cut(v, "-")
	parts := strings.Split(v, ".")
	if len(parts) < 2 || len(parts) > 3 {
		return out, false
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil {
			return out, false
		}
		out[i] = n
	}
	return out, true
}

// Setup loads the topology of nats/ with the settings' replicas, then
// ensures it on the server (or, with Ensure false, verifies it and logs each
// difference in replicas), logging what it changed. more, when set and
// Ensure is, ensures what else the processes keep on the broker (a
// key-value bucket) and says what it changed. It returns the topology for
// a Keeper.
func Setup(ctx context.Context, js jetstream.JetStream, s Settings, log *slog.Logger, more func(context.Context, jetstream.JetStream) ([]string, error)) (*Topology, error) {
	topo, err := Default()
	if err != nil {
		return nil, err
	}
	if topo, err = topo.WithReplicas(max(s.Replicas, 1)); err != nil {
		return nil, fmt.Errorf("NATS_REPLICAS: %w", err)
	}
	if err := CheckServerVersion(js.Conn().ConnectedServerVersion()); err != nil {
		return nil, err
	}
	if note := VersionNote(js.Conn().ConnectedServerVersion(), topo.replicas()); note != "" {
		log.Warn(note)
	}
	if !s.Ensure {
		var diffs []string
		err := retryUnanswered(ctx, func(ctx context.Context) (err error) {
			diffs, err = topo.Verify(ctx, js)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("NATS_ENSURE_TOPOLOGY=false: %w", err)
		}
		for _, d := range diffs {
			log.Warn("nats topology differs from the settings; NATS_ENSURE_TOPOLOGY=false leaves it as it is", "difference", d)
		}
		return topo, nil
	}
	changed, err := topo.EnsureWait(ctx, js)
	if err != nil {
		return nil, err
	}
	if more != nil {
		err = retryUnanswered(ctx, func(ctx context.Context) error {
			extra, err := more(ctx, js)
			changed = append(changed, extra...)
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	for _, c := range changed {
		log.Info("nats topology", "change", c)
	}
	return topo, nil
}

// attemptTimeout bounds one attempt of a start-up request, so that a request
// lost in a leader election is sent again rather than waited on.
const attemptTimeout = 5 * time.Second

// placementWait bounds how long a start-up request waits for the cluster to
// know its peers before "peer offline" is taken as the answer.
const placementWait = 30 * time.Second

// EnsureWait is Ensure for a process starting up, perhaps beside a broker
// that is starting too: it sends again a request nobody answered until ctx
// ends, and one refused because a peer is offline for up to 30 seconds. It
// returns every change made, across its attempts.
func (t *Topology) EnsureWait(ctx context.Context, js jetstream.JetStream) ([]string, error) {
	var changed []string
	err := retryUnanswered(ctx, func(ctx context.Context) error {
		c, err := t.Ensure(ctx, js)
		changed = append(changed, c...)
		return err
	})
	return changed, err
}

// retryUnanswered runs fn until it succeeds, fails with an answer, or ctx
// ends. A request nobody answered (a stream or meta leader election, a
// server restarting: a timeout, no responders, "JetStream system
// temporarily unavailable") is not an answer; nor, for placementWait, is
// "no suitable peers ... peer offline", which a cluster that has just
// started gives until its meta leader has heard from every peer.
func retryUnanswered(ctx context.Context, fn func(context.Context) error) error {
	var offlineSince time.Time
	for {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		err := fn(actx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return err
		}
		if placementPending(err) {
			if offlineSince.IsZero() {
				offlineSince = time.Now()
			}
			if time.Since(offlineSince) >= placementWait {
				return err
			}
		} else if !Unanswered(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// placementPending reports whether err is the server refusing to place
// replicas because a peer it counts on is offline: in a cluster that has
// just started, the meta leader counts a peer offline until the peer's
// first statistics reach it, a second or so after its election.
func placementPending(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == 10005 &&
		strings.Contains(apiErr.Description, "peer offline")
}

// Unanswered reports whether err means JetStream gave no answer (a timeout,
// no responders, its cluster temporarily unavailable): the outcome of the
// request is unknown, and the same request may be sent again.
func Unanswered(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == 10008 // JetStream system temporarily unavailable
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrConnectionReconnecting)
}
