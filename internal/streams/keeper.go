package streams

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// KeeperConfig configures a Keeper.
type KeeperConfig struct {
	// Topology is what must exist (with its replicas); required.
	Topology *Topology
	// JetStream reaches the broker; required.
	JetStream jetstream.JetStream
	// Ensure recreates a stream or consumer found missing; false only
	// reports it (NATS_ENSURE_TOPOLOGY=false).
	Ensure bool
	// EnsureMore, when set, recreates what else the processes keep on the
	// broker (the senders' flow bucket) after a recreation of the topology:
	// what the broker's store lost, it lost together.
	EnsureMore func(context.Context, jetstream.JetStream) ([]string, error)
	// Interval between checks; default 5s. A reconnect to the broker
	// triggers a check at once, whatever the interval.
	Interval time.Duration
	// Timeout bounds one check or one recreation; default 10s.
	Timeout time.Duration
	// Logger receives the keeper's logs, as the process's own lines;
	// default slog.Default().
	Logger *slog.Logger
}

// Keeper watches the topology while a process runs. A broker that lost its
// store (a single server restarted on an empty disk, a cluster all of whose
// copies were lost) comes back without the streams: the relay's
// publications then find no stream and the senders' pulls no consumer, and
// nothing would move until a restart re-ran the start-up Ensure. The keeper
// finds the loss within Interval (or at the reconnect) and recreates the
// topology in place; Postgres still holds every row, and the relay and the
// reconciler publish again whatever the lost stream held.
type Keeper struct {
	cfg       KeeperConfig
	log       *slog.Logger
	recreated prometheus.Counter

	mu       sync.Mutex
	reported bool // the current loss was logged (Ensure false)
}

// NewKeeper returns a Keeper, or an error naming the bad setting.
func NewKeeper(cfg KeeperConfig) (*Keeper, error) {
	cfg.Interval = cmp.Or(cfg.Interval, 5*time.Second)
	cfg.Timeout = cmp.Or(cfg.Timeout, 10*time.Second)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	switch {
	case cfg.Topology == nil || cfg.JetStream == nil:
		return nil, errors.New("streams: KeeperConfig.Topology and JetStream are required")
	case cfg.Interval < 10*time.Millisecond:
		return nil, fmt.Errorf("streams: keeper Interval %s is below 10ms", cfg.Interval)
	case cfg.Timeout <= 0:
		return nil, fmt.Errorf("streams: keeper Timeout %s must be positive", cfg.Timeout)
	}
	k := &Keeper{
		cfg: cfg,
		log: cfg.Logger,
		recreated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sendonce_nats_topology_recreated_total",
			Help: "Times this process found streams or consumers of the topology missing on the broker and recreated them.",
		}),
	}
	return k, nil
}

// Describe implements prometheus.Collector: a process registers its keeper
// for sendonce_nats_topology_recreated_total.
func (k *Keeper) Describe(ch chan<- *prometheus.Desc) { k.recreated.Describe(ch) }

// Collect implements prometheus.Collector.
func (k *Keeper) Collect(ch chan<- prometheus.Metric) { k.recreated.Collect(ch) }

// Run checks the topology every Interval, and at once after each reconnect
// to the broker, until ctx is done; it recreates what is missing when
// Ensure is set. It returns nil.
func (k *Keeper) Run(ctx context.Context) error {
	nc := k.cfg.JetStream.Conn()
	reconnected := nc.StatusChanged(nats.CONNECTED)
	defer nc.RemoveStatusListener(reconnected)
	t := time.NewTicker(k.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-reconnected:
		}
		k.Pass(ctx)
	}
}

// Pass checks the topology once and recreates what is missing (when Ensure
// is set); it reports whether everything was there, or is now.
func (k *Keeper) Pass(ctx context.Context) bool {
	cctx, cancel := context.WithTimeout(ctx, k.cfg.Timeout)
	defer cancel()
	missing, err := k.missing(cctx)
	if err != nil {
		// No answer (an election, a reconnect in progress): not a loss.
		k.log.DebugContext(ctx, "topology check without an answer", "err", err)
		return false
	}
	if len(missing) == 0 {
		k.markOK()
		return true
	}
	if !k.cfg.Ensure {
		k.mu.Lock()
		first := !k.reported
		k.reported = true
		k.mu.Unlock()
		if first {
			k.log.ErrorContext(ctx, "nats topology is missing on the broker and NATS_ENSURE_TOPOLOGY=false: create it, nothing is published or sent until then", "missing", missing)
		}
		return false
	}
	changed, err := k.cfg.Topology.Ensure(cctx, k.cfg.JetStream)
	if err == nil && k.cfg.EnsureMore != nil {
		var more []string
		more, err = k.cfg.EnsureMore(cctx, k.cfg.JetStream)
		changed = append(changed, more...)
	}
	if err != nil {
		k.log.WarnContext(ctx, "nats topology is missing on the broker; recreating it failed, will retry", "missing", missing, "err", err)
		return false
	}
	k.recreated.Inc()
	k.log.WarnContext(ctx, "nats topology was missing on the broker (its store was lost?); recreated it", "missing", missing, "changes", changed)
	k.markOK()
	return true
}

func (k *Keeper) markOK() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.reported = false
}

// missing returns what the broker says does not exist. An error means the
// broker did not say (no answer, no leader), not that something is missing.
func (k *Keeper) missing(ctx context.Context) ([]string, error) {
	var out []string
	gone := map[string]bool{}
	for _, cfg := range k.cfg.Topology.Streams {
		_, err := k.cfg.JetStream.Stream(ctx, cfg.Name)
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			out = append(out, "stream "+cfg.Name)
			gone[cfg.Name] = true
		case err != nil:
			return nil, fmt.Errorf("look up stream %s: %w", cfg.Name, err)
		}
	}
	for _, s := range slices.Sorted(maps.Keys(k.cfg.Topology.Consumers)) {
		if gone[s] {
			for _, cfg := range k.cfg.Topology.Consumers[s] {
				out = append(out, "consumer "+s+"/"+cfg.Durable)
			}
			continue
		}
		for _, cfg := range k.cfg.Topology.Consumers[s] {
			_, err := k.cfg.JetStream.Consumer(ctx, s, cfg.Durable)
			switch {
			case errors.Is(err, jetstream.ErrConsumerNotFound):
				out = append(out, "consumer "+s+"/"+cfg.Durable)
			case err != nil:
				return nil, fmt.Errorf("look up consumer %s/%s: %w", s, cfg.Durable, err)
			}
		}
	}
	return out, nil
}
