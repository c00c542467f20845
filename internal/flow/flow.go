// Package flow paces provider requests across every sender process: one rate
// limit (requests per second to the provider, shared by all senders) and a
// pause every sender honours when the provider asks for one (a 429 or 503
// with Retry-After).
//
// The limit is shared through a JetStream key-value bucket. Each sender puts
// a heartbeat under its own key every Heartbeat, carrying its demand (the
// messages waiting for a token), and watches the bucket. From what it sees,
// each computes the same split: sender i may send
//
//	limit * (1 + demand_i) / sum over live senders (1 + demand_j)
//
// requests per second from a local token bucket whose capacity is its share
// of the burst. The shares add up to the limit, however many senders run,
// and follow the work: an idle sender keeps a sliver, a busy one the rest.
// A sender starts with an empty bucket, so a restart is no burst. A sender
// that cannot reach the bucket keeps to limit divided by the senders it last
// saw, never to no limit.
//
// A pause is a key of its own holding the time it ends; every sender holds
// its token bucket shut until then. The waits happen before a row is
// claimed, so a paused message spends no attempt.
//
// Liveness and pauses compare the server's timestamps and the bucket's
// values with the local clock: the senders' and the server's clocks are
// assumed within a second of each other (NTP).
package flow

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultBucket is the key-value bucket the senders share.
const DefaultBucket = "sendonce_flow"

// MaxPause bounds a pause, whatever a provider or a bucket value says.
const MaxPause = time.Hour

// Config configures a Limiter.
type Config struct {
	// JetStream holds the shared bucket; required.
	JetStream jetstream.JetStream
	// Bucket names the key-value bucket; default DefaultBucket.
	Bucket string
	// Create creates the bucket when it is missing; without it, a missing
	// bucket makes the limiter keep to its fallback share.
	Create bool
	// Replicas of the bucket when it is created; default 1.
	Replicas int
	// Limit is the provider requests per second allowed across every
	// sender; 0 sends without a limit (a pause still holds).
	Limit float64
	// Burst is the most requests sent at once across every sender after an
	// idle spell; default max(1, Limit/10).
	Burst float64
	// ID names this sender's key; required, unique per process.
	ID string
	// Heartbeat is how often this sender puts its demand; default 500ms.
	Heartbeat time.Duration
	// LiveFor is how long a sender counts as running after its last
	// heartbeat; default 4 * Heartbeat.
	LiveFor time.Duration
	// Demand reports the messages waiting for a token; nil counts none.
	Demand func() int
	// Logger receives the limiter's logs; default slog.Default().
	Logger *slog.Logger
	// Registerer receives the limiter's metrics; nil registers nothing.
	Registerer prometheus.Registerer
}

// Limiter paces one sender's provider requests within the shared limit.
type Limiter struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics

	mu          sync.Mutex
	tokens      float64
	last        time.Time
	rate        float64 // this sender's share, requests per second
	pausedUntil time.Time
	peers       map[string]peer // other senders, by id, as last seen
	lastEcho    time.Time       // when this sender last saw its own heartbeat
	lastLive    int             // senders seen live the last time the bucket answered
	degraded    bool
	lastWarn    time.Time // the last "unreachable" warning, to log one in a while
	synced      bool      // the bucket's state has been read once
	syncedAt    time.Time
	recomputed  time.Time // the last time the share was computed
	started     time.Time
	kv          jetstream.KeyValue
}

type peer struct {
	demand int
	seen   time.Time // the server's time of the heartbeat
}

// heartbeat is the value of a sender's key.
type heartbeat struct {
	Demand int `json:"demand"`
}

// New returns a Limiter, or an error naming the bad setting. It starts with
// an empty token bucket and no share: it sends nothing until it has seen the
// bucket (its first heartbeat back, normally within one Heartbeat), or, if
// the bucket does not answer within LiveFor, until it falls back to the
// limit divided by the senders it knows of (at a cold start, itself alone).
func New(cfg Config) (*Limiter, error) {
	cfg.Bucket = cmp.Or(cfg.Bucket, DefaultBucket)
	cfg.Replicas = cmp.Or(cfg.Replicas, 1)
	cfg.Heartbeat = cmp.Or(cfg.Heartbeat, 500*time.Millisecond)
	cfg.LiveFor = cmp.Or(cfg.LiveFor, 4*cfg.Heartbeat)
	if cfg.Burst == 0 {
		cfg.Burst = max(1, cfg.Limit/10)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	switch {
	case cfg.JetStream == nil:
		return nil, errors.New("flow: Config.JetStream is required")
	case cfg.ID == "" || strings.ContainsAny(cfg.ID, ".*> "):
		return nil, fmt.Errorf("flow: ID %q must be a non-empty key token", cfg.ID)
	case cfg.Limit < 0:
		return nil, fmt.Errorf("flow: Limit %g must not be negative", cfg.Limit)
	case cfg.Burst < 1:
		return nil, fmt.Errorf("flow: Burst %g must be at least 1", cfg.Burst)
	case cfg.LiveFor <= cfg.Heartbeat:
		return nil, fmt.Errorf("flow: LiveFor %s must exceed Heartbeat %s", cfg.LiveFor, cfg.Heartbeat)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	l := &Limiter{
		cfg: cfg, log: cfg.Logger.With("component", "flow"), metrics: m,
		peers: map[string]peer{}, lastLive: 1, last: now, started: now,
	}
	return l, nil
}

// Limited reports whether requests are paced (Limit > 0).
func (l *Limiter) Limited() bool { return l.cfg.Limit > 0 }

// Wait takes one token, waiting for it (and for any pause to end) until ctx
// is done, which it returns.
func (l *Limiter) Wait(ctx context.Context) error {
	waited := false
	for {
		d, ok := l.take(time.Now())
		if ok {
			if waited {
				l.metrics.tokens.WithLabelValues("waited").Inc()
			} else {
				l.metrics.tokens.WithLabelValues("granted").Inc()
			}
			return nil
		}
		waited = true
		// Wake at least every 50 ms: the share may change meanwhile.
		t := time.NewTimer(min(d, 50*time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// TryTake takes one token if one is there now, without waiting.
func (l *Limiter) TryTake() bool {
	_, ok := l.take(time.Now())
	if ok {
		l.metrics.tokens.WithLabelValues("granted").Inc()
	} else {
		l.metrics.tokens.WithLabelValues("denied").Inc()
	}
	return ok
}

// Return gives back a token taken for a message that made no request (its
// row was finished, or held by another sender).
func (l *Limiter) Return() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cfg.Limit > 0 {
		l.tokens = min(l.capacity(), l.tokens+1)
	}
}

// take takes a token at now, or says how long until one may be there.
func (l *Limiter) take(now time.Time) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Before(l.pausedUntil) {
		return l.pausedUntil.Sub(now), false
	}
	if l.cfg.Limit <= 0 {
		return 0, true
	}
	if stale := now.Sub(maxTime(l.recomputed, l.started)); stale > 2*l.cfg.LiveFor {
		// The loop that keeps the share up to date has not run for a while
		// (Run not started, or held up): keep to the fallback share rather
		// than to a stale one, or to none.
		l.refill(now)
		l.rate = l.cfg.Limit / float64(max(1, l.lastLive))
		l.metrics.share.Set(l.rate)
	}
	l.refill(now)
	if l.tokens >= 1 {
		l.tokens--
		return 0, true
	}
	if l.rate <= 0 {
		return 50 * time.Millisecond, false
	}
	return time.Duration((1 - l.tokens) / l.rate * float64(time.Second)), false
}

// refill adds the tokens earned since the last refill; l.mu is held.
func (l *Limiter) refill(now time.Time) {
	if el := now.Sub(l.last); el > 0 {
		l.tokens = min(l.capacity(), l.tokens+el.Seconds()*l.rate)
	}
	l.last = now
}

// capacity is this sender's share of the burst; l.mu is held.
func (l *Limiter) capacity() float64 {
	return max(1, l.cfg.Burst*l.rate/l.cfg.Limit)
}

// Pause holds every sender's requests for d: this one at once, the others
// through the bucket. A longer pause in force is kept.
func (l *Limiter) Pause(ctx context.Context, d time.Duration) {
	d = min(d, MaxPause)
	until := time.Now().Add(d)
	if !l.pauseUntil(until) {
		return
	}
	l.log.WarnContext(ctx, "provider asked to slow down; every sender pauses", "for", d.String())
	l.mu.Lock()
	kv := l.kv
	l.mu.Unlock()
	if kv == nil {
		return
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if _, err := kv.Put(pctx, "pause", []byte(strconv.FormatInt(until.UnixNano(), 10))); err != nil {
		l.log.WarnContext(ctx, "pause not shared; the other senders will meet the provider's limit themselves", "err", err)
	}
}

// pauseUntil moves the pause's end to until if that is later (than now
// too: a shared pause read after it ended, as a sender starting later
// reads it from the bucket, is no pause), and reports whether it did.
func (l *Limiter) pauseUntil(until time.Time) bool {
	now := time.Now()
	until = minTime(until, now.Add(MaxPause))
	l.mu.Lock()
	defer l.mu.Unlock()
	from := maxTime(now, l.pausedUntil)
	if !until.After(from) {
		return false
	}
	l.metrics.pauseSeconds.Add(until.Sub(from).Seconds())
	l.pausedUntil = until
	return true
}

// Run keeps this sender's heartbeat in the bucket and the shares up to date
// until ctx is done. It never fails: an unreachable bucket means the
// fallback share until it is back.
func (l *Limiter) Run(ctx context.Context) error {
	t := time.NewTicker(l.cfg.Heartbeat)
	defer t.Stop()
	var (
		watcher jetstream.KeyWatcher
		updates <-chan jetstream.KeyValueEntry
	)
	defer func() {
		if watcher != nil {
			_ = watcher.Stop()
		}
	}()
	for {
		if watcher == nil {
			watcher = l.connect(ctx)
			if watcher != nil {
				updates = watcher.Updates()
				l.beat(ctx) // at once: the share waits for this heartbeat's echo
			}
		}
		select {
		case <-ctx.Done():
			l.goodbye()
			return nil
		case e, ok := <-updates:
			if !ok {
				_ = watcher.Stop()
				watcher, updates = nil, nil
				continue
			}
			if e == nil {
				// The bucket's current state has been read: every live
				// sender is known.
				l.mu.Lock()
				if !l.synced {
					l.synced, l.lastEcho, l.syncedAt = true, time.Now(), time.Now()
				}
				l.mu.Unlock()
				l.recompute(time.Now())
			} else {
				// Every heartbeat, this sender's or another's, changes the
				// split: take it in at once.
				l.observe(e)
				l.recompute(time.Now())
			}
		case <-t.C:
			l.beat(ctx)
			l.recompute(time.Now())
		}
	}
}

// bucketConfig is the shared bucket's configuration.
func bucketConfig(name string, replicas int, liveFor time.Duration) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      name,
		Description: "sendonce senders: heartbeats and demand for the shared provider rate limit, and provider pauses",
		History:     1,
		// Heartbeats of stopped senders, and ended pauses, go away.
		TTL:      max(10*time.Second, 4*liveFor),
		Storage:  jetstream.MemoryStorage,
		Replicas: max(1, replicas),
	}
}

// EnsureBucket creates the shared bucket (DefaultBucket) when it is missing,
// as part of a service's topology, and reports whether it did. An existing
// bucket is left as it is.
func EnsureBucket(ctx context.Context, js jetstream.JetStream, replicas int) (bool, error) {
	if _, err := js.KeyValue(ctx, DefaultBucket); err == nil {
		return false, nil
	} else if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return false, fmt.Errorf("flow bucket %s: %w", DefaultBucket, err)
	}
	_, err := js.CreateKeyValue(ctx, bucketConfig(DefaultBucket, replicas, 2*time.Second))
	if errors.Is(err, jetstream.ErrBucketExists) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("create flow bucket %s: %w", DefaultBucket, err)
	}
	return true, nil
}

// connect finds (or creates) the bucket and starts watching it; nil when it
// cannot, to be tried again at the next heartbeat.
func (l *Limiter) connect(ctx context.Context) jetstream.KeyWatcher {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	kv, err := l.cfg.JetStream.KeyValue(cctx, l.cfg.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) && l.cfg.Create {
		kv, err = l.cfg.JetStream.CreateKeyValue(cctx, bucketConfig(l.cfg.Bucket, l.cfg.Replicas, l.cfg.LiveFor))
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = l.cfg.JetStream.KeyValue(cctx, l.cfg.Bucket)
		}
	}
	if err != nil {
		l.setDegraded(fmt.Errorf("bucket %s: %w", l.cfg.Bucket, err))
		return nil
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		l.setDegraded(fmt.Errorf("watch bucket %s: %w", l.cfg.Bucket, err))
		return nil
	}
	l.mu.Lock()
	l.kv = kv
	l.mu.Unlock()
	return w
}

// beat puts this sender's demand.
func (l *Limiter) beat(ctx context.Context) {
	l.mu.Lock()
	kv := l.kv
	l.mu.Unlock()
	if kv == nil {
		return
	}
	demand := 0
	if l.cfg.Demand != nil {
		demand = l.cfg.Demand()
	}
	b, _ := json.Marshal(heartbeat{Demand: demand})
	pctx, cancel := context.WithTimeout(ctx, l.cfg.Heartbeat)
	defer cancel()
	if _, err := kv.Put(pctx, "senders."+l.cfg.ID, b); err != nil && ctx.Err() == nil {
		l.setDegraded(fmt.Errorf("put heartbeat: %w", err))
	}
}

// goodbye removes this sender's heartbeat, so the others take its share at
// once rather than when it ages out.
func (l *Limiter) goodbye() {
	l.mu.Lock()
	kv := l.kv
	l.mu.Unlock()
	if kv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = kv.Delete(ctx, "senders."+l.cfg.ID)
}

// observe takes in one bucket entry and reports whether it was this
// sender's own heartbeat.
func (l *Limiter) observe(e jetstream.KeyValueEntry) bool {
	key := e.Key()
	switch {
	case key == "pause":
		if e.Operation() != jetstream.KeyValuePut {
			return false
		}
		n, err := strconv.ParseInt(string(e.Value()), 10, 64)
		if err != nil {
			return false
		}
		if until := time.Unix(0, n); l.pauseUntil(until) {
			l.log.Warn("provider pause shared by another sender", "for", time.Until(until).Round(time.Millisecond).String())
		}
	case strings.HasPrefix(key, "senders."):
		id := strings.TrimPrefix(key, "senders.")
		l.mu.Lock()
		defer l.mu.Unlock()
		if e.Operation() != jetstream.KeyValuePut {
			delete(l.peers, id)
			return false
		}
		if id == l.cfg.ID {
			l.lastEcho = time.Now()
			return true
		}
		var hb heartbeat
		if json.Unmarshal(e.Value(), &hb) != nil {
			return false
		}
		l.peers[id] = peer{demand: max(0, hb.Demand), seen: e.Created()}
	}
	return false
}

// recompute sets this sender's share from the senders seen live, or the
// fallback when its own heartbeats have not come back for LiveFor.
func (l *Limiter) recompute(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recomputed = now
	if l.cfg.Limit <= 0 {
		return
	}
	own := 1.0
	if l.cfg.Demand != nil {
		own += float64(l.cfg.Demand())
	}
	if !l.synced && now.Sub(l.started) <= l.cfg.LiveFor {
		// Not one look at the bucket yet: send nothing rather than guess.
		return
	}
	if l.synced && now.Sub(l.syncedAt) < l.cfg.Heartbeat {
		// Senders started at the same moment cannot see each other yet:
		// wait one heartbeat, so that every one of them has put its own,
		// before taking a share (a fleet started together is no burst).
		return
	}
	if !l.synced || now.Sub(l.lastEcho) > l.cfg.LiveFor {
		// The bucket is not answering: keep to the share of the senders
		// last seen, never more.
		l.refill(now)
		l.rate = l.cfg.Limit / float64(max(1, l.lastLive))
		l.metrics.share.Set(l.rate)
		if !l.degraded {
			l.degraded = true
			l.metrics.degraded.Set(1)
			l.log.Warn("shared rate limit unreachable; keeping to the fallback share", "senders_last_seen", l.lastLive, "rate", l.rate)
		}
		return
	}
	// A peer whose heartbeats stopped is gone, but only while this sender's
	// own heartbeats come back: when they are late too, the bucket is what
	// is slow, and the last view stands (so that a fallback counts the
	// senders that were really there).
	prune := now.Sub(l.lastEcho) <= 2*l.cfg.Heartbeat
	total, live := own, 1
	for id, p := range l.peers {
		if prune && now.Sub(p.seen) > l.cfg.LiveFor {
			delete(l.peers, id)
			continue
		}
		total += 1 + float64(p.demand)
		live++
	}
	l.refill(now)
	l.rate = l.cfg.Limit * own / total
	l.lastLive = live
	l.metrics.share.Set(l.rate)
	l.metrics.senders.Set(float64(live))
	if l.degraded {
		l.degraded = false
		l.metrics.degraded.Set(0)
		l.log.Info("shared rate limit reachable again", "senders", live)
	}
}

// setDegraded logs why the bucket is unreachable, once in a while; the
// share falls back in recompute, once this sender's heartbeats have been
// missing for LiveFor.
func (l *Limiter) setDegraded(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now := time.Now(); now.Sub(l.lastWarn) > 30*time.Second {
		l.lastWarn = now
		l.log.Warn("shared flow state unreachable", "err", err)
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

type metrics struct {
	tokens       *prometheus.CounterVec
	share        prometheus.Gauge
	senders      prometheus.Gauge
	degraded     prometheus.Gauge
	pauseSeconds prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sendonce_sender_rate_tokens_total",
			Help: "Provider request tokens, by result: granted at once, waited for, or denied to a message that asked without waiting.",
		}, []string{"result"}),
		share: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sendonce_sender_rate_share",
			Help: "This sender's share of the shared provider rate limit, requests per second.",
		}),
		senders: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sendonce_sender_rate_senders",
			Help: "Senders sharing the provider rate limit, as this sender last saw them.",
		}),
		degraded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sendonce_sender_rate_fallback",
			Help: "1 while the shared flow state is unreachable and this sender keeps to its fallback share.",
		}),
		pauseSeconds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sendonce_provider_pause_seconds_total",
			Help: "Seconds this sender held its requests because the provider asked every sender to wait (429 or 503 with Retry-After).",
		}),
	}
	for _, r := range []string{"granted", "waited", "denied"} {
		m.tokens.WithLabelValues(r)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.tokens, m.share, m.senders, m.degraded, m.pauseSeconds} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("flow: register metrics: %w", err)
			}
		}
	}
	return m, nil
}
