// Package flow paces provider requests across every sender process: one rate
// limit (requests per second to the provider, shared by all senders) and a
// pause every sender honours when the provider asks for one (a 429 or 503
// with Retry-After).
//
// The limit is shared through a JetStream key-value bucket. Each sender puts
// a heartbeat under its own key every Heartbeat, carrying its weight: 64
// while it has messages waiting for a token (busy), 1 once it has had none
// for two heartbeats (idle). From what it sees, each computes the same
// split: sender i may send
//
//	limit * weight_i / sum over live senders of weight_j
//
// requests per second, so busy senders share the limit evenly and an idle
// one keeps a sliver. Its token bucket holds one token and its part (the
// same proportion) of the burst left after one token per sender: the buckets
// of all senders together hold the burst, not a burst each. A sender starts
// with an empty bucket, so a restart is no burst.
//
// A sender lowers its share without waiting: when its own work ends, and
// as soon as it sees another sender's weight grow or a new sender appear. It raises its
// share only with what every other sender has already seen: a sender that
// gets work puts its new weight at once, not at its next heartbeat, and
// takes the larger share one Heartbeat after the bucket stored it (the
// others are assumed to see a heartbeat within one Heartbeat), having kept
// to the smaller one meanwhile. So the shares add up to no more than the
// limit while demand changes, and in any second the provider sees at most
// the limit and the burst (the default burst is a tenth of the limit).
//
// A sender that cannot read the bucket (it started while the bucket was
// missing or out of reach, or lost it) keeps to the limit divided by the
// senders it expects (ExpectedSenders) or the senders it last saw, whichever
// is more: never the whole limit because it is alone in what it can see.
//
// A pause is a key of its own holding the time it ends; every sender holds
// its token bucket shut until then. The waits happen before a row is
// claimed, so a paused message spends no attempt.
//
// Liveness and pauses compare the server's timestamps and the bucket's
// values with the local clock: the senders' and the server's clocks are
// assumed within a second of each other (NTP). Shares do not depend on the
// clocks: each sender times its own heartbeats.
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

// DefaultExpectedSenders is the default of Config.ExpectedSenders.
const DefaultExpectedSenders = 3

// A sender's weight in the split: busy while it has messages waiting for a
// token, idle otherwise. An idle sender keeps 1/64 of a busy one's share:
// enough to send a message that comes now and then at once (its bucket
// holds a token), little taken from the busy ones. Two levels rather than
// the count of messages waiting: that count moves with every fetch and
// every pick, and a weight that moved as much would be put, and waited
// for, all the time.
const (
	idleWeight = 1.0
	busyWeight = 64.0
)

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
	// idle spell: every sender's bucket holds one token and its part of the
	// rest, so with more senders than Burst it is one request per sender.
	// Default max(1, Limit/10).
	Burst float64
	// ExpectedSenders is how many senders a sender assumes share the limit
	// while it cannot read the bucket (it started while the bucket was
	// missing or out of reach, or lost it): it then keeps to Limit divided
	// by ExpectedSenders or by the senders it last saw, whichever is more.
	// Set it to the number of sender processes you run (1 for a single
	// one). Default DefaultExpectedSenders.
	ExpectedSenders int
	// ID names this sender's key; required, unique per process.
	ID string
	// Heartbeat is how often this sender puts its weight; default 500ms. A
	// sender that gets work puts its new weight at once, and takes the
	// larger share one Heartbeat after the bucket stored it: every sender is
	// assumed to see a heartbeat within one Heartbeat.
	Heartbeat time.Duration
	// LiveFor is how long a sender counts as running after its last
	// heartbeat; default 4 * Heartbeat.
	LiveFor time.Duration
	// Circuits, when set, reports the sender's provider circuits (provider
	// name to state): each heartbeat carries them, for the console.
	Circuits func() map[string]string
	// Demand reports the messages waiting for a token; nil counts none. It
	// is called often (on every wait for a token), so it must be cheap.
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

	// nudge asks Run to put this sender's weight now: it has work again.
	nudge chan struct{}

	mu          sync.Mutex
	tokens      float64
	last        time.Time
	rate        float64 // this sender's share, requests per second
	capacity    float64 // this sender's part of the burst, tokens
	pausedUntil time.Time
	peers       map[string]peer // other senders, by id, as last seen
	said        []announcement  // this sender's weights as put, oldest first
	lastBusy    time.Time       // when this sender last had messages waiting
	lastEcho    time.Time       // when this sender last saw its own heartbeat
	lastLive    int             // senders seen live the last time the bucket answered
	degraded    bool
	lastWarn    time.Time // the last "unreachable" warning, to log one in a while
	synced      bool      // the bucket's state has been read once
	recomputed  time.Time // the last time the share was computed
	started     time.Time
	kv          jetstream.KeyValue
}

type peer struct {
	weight float64
	seen   time.Time // the server's time of the heartbeat
}

// announcement is a weight this sender put in the bucket.
type announcement struct {
	weight float64
	// stored is when the bucket answered that it stored the weight; zero
	// while the put has not answered, or if it failed (the weight may
	// still have been stored, and seen).
	stored time.Time
}

// heartbeat is the value of a sender's key.
type heartbeat struct {
	// Weight is the sender's weight in the split.
	Weight float64 `json:"weight"`
	// Demand is Weight less one: what senders from before weights read
	// (they weigh a sender 1 + demand), so that a fleet part old, part new
	// (a rolling upgrade) still splits the limit the same way.
	Demand int `json:"demand"`
	// Circuits are the sender's provider circuits (SMS_PROVIDERS), by
	// provider: closed, half-open or open.
	Circuits map[string]string `json:"circuits,omitempty"`
}

// New returns a Limiter, or an error naming the bad setting. It starts with
// an empty token bucket and no share: it sends nothing until the other
// senders have had one Heartbeat to see its first heartbeat, or, if the
// bucket does not answer within LiveFor, until it falls back to the limit
// divided by ExpectedSenders.
func New(cfg Config) (*Limiter, error) {
	cfg.Bucket = cmp.Or(cfg.Bucket, DefaultBucket)
	cfg.Replicas = cmp.Or(cfg.Replicas, 1)
	cfg.ExpectedSenders = cmp.Or(cfg.ExpectedSenders, DefaultExpectedSenders)
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
	case cfg.ExpectedSenders < 1:
		return nil, fmt.Errorf("flow: ExpectedSenders %d must be at least 1", cfg.ExpectedSenders)
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
		peers: map[string]peer{}, lastLive: 1, last: now, started: now, capacity: 1,
		nudge: make(chan struct{}, 1),
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
		l.noteDemand(time.Now())
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
	l.noteDemand(time.Now())
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
		l.tokens = min(l.capacity, l.tokens+1)
	}
}

// noteDemand records whether this sender has messages waiting, and asks Run
// to put its weight at once when it has work again: the other senders make
// room for it as soon as they see that, and it takes the room one Heartbeat
// later.
func (l *Limiter) noteDemand(now time.Time) {
	if l.cfg.Demand == nil || l.cfg.Limit <= 0 || l.cfg.Demand() <= 0 {
		return
	}
	l.mu.Lock()
	l.lastBusy = now
	announce := l.kv != nil && l.announced() < busyWeight
	l.mu.Unlock()
	if announce {
		select {
		case l.nudge <- struct{}{}:
		default:
		}
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
		l.fallBack(now)
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

// refill adds the tokens earned since the last refill; l.mu is held. It
// runs before every change of the rate or the capacity, so that the tokens
// earned so far are earned at the rate in force then.
func (l *Limiter) refill(now time.Time) {
	if el := now.Sub(l.last); el > 0 {
		l.tokens = min(l.capacity, l.tokens+el.Seconds()*l.rate)
	}
	l.last = now
}

// fallBack keeps to the share of a sender that cannot read the bucket: the
// limit divided by the senders expected or last seen, whichever is more;
// l.mu is held.
func (l *Limiter) fallBack(now time.Time) {
	n := float64(max(l.cfg.ExpectedSenders, l.lastLive, 1))
	l.refill(now)
	l.rate = l.cfg.Limit / n
	l.capacity = 1 + max(0, l.cfg.Burst-n)/n
	l.tokens = min(l.tokens, l.capacity)
	l.metrics.share.Set(l.rate)
}

// split returns a sender's rate (requests per second) and the capacity of
// its token bucket (tokens), from its own weight and the other live
// senders' weights. Seen alike by every sender, the rates add up to the
// limit and the capacities to the burst: every bucket holds one token (a
// sender must be able to send at all), and the burst left after one token
// per sender is split as the rate is. A weight of 0 gets nothing.
func split(limit, burst, own float64, others []float64) (rate, capacity float64) {
	if own <= 0 {
		return 0, 1
	}
	total := own
	for _, w := range others {
		total += w
	}
	part := own / total
	return limit * part, 1 + max(0, burst-float64(1+len(others)))*part
}

// usable returns the largest weight this sender may take its share by at
// now: no more than any weight the other senders may still hold for it.
// They have seen the latest weight the bucket stored at least settle ago,
// or one put after it, so it is the least of those; 0 while no weight has
// been stored that long (the others may not know this sender yet).
func usable(said []announcement, now time.Time, settle time.Duration) float64 {
	k := settled(said, now, settle)
	if k < 0 {
		return 0
	}
	w := said[k].weight
	for _, a := range said[k+1:] {
		w = min(w, a.weight)
	}
	return w
}

// settled returns the index of the latest weight stored at least settle
// before now, or -1.
func settled(said []announcement, now time.Time, settle time.Duration) int {
	for i := len(said) - 1; i >= 0; i-- {
		if a := said[i]; !a.stored.IsZero() && now.Sub(a.stored) >= settle {
			return i
		}
	}
	return -1
}

// weight is this sender's weight now: busy while it has had messages
// waiting within the last two heartbeats (a sender whose backlog empties
// between two fetches is still busy); l.mu is held.
func (l *Limiter) weight(now time.Time) float64 {
	if !l.lastBusy.IsZero() && now.Sub(l.lastBusy) < 2*l.cfg.Heartbeat {
		return busyWeight
	}
	return idleWeight
}

// announced is the weight this sender put last, stored or not (0: none
// yet); l.mu is held.
func (l *Limiter) announced() float64 {
	if len(l.said) == 0 {
		return 0
	}
	return l.said[len(l.said)-1].weight
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
	// settle fires one Heartbeat after a weight was stored: the others have
	// seen it, and this sender may take a larger share.
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	defer settle.Stop()
	beat := func() {
		if l.beat(ctx) {
			settle.Reset(l.cfg.Heartbeat)
		}
	}
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
				beat() // at once: the share waits for this heartbeat to settle
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
					l.synced, l.lastEcho = true, time.Now()
				}
				l.mu.Unlock()
				l.recompute(time.Now())
			} else {
				// Every heartbeat, this sender's or another's, changes the
				// split: take it in at once (a share that shrinks must
				// shrink before the sender that grew takes more).
				l.observe(e)
				l.recompute(time.Now())
			}
		case <-l.nudge:
			// Work again: say so now rather than at the next heartbeat.
			beat()
			l.recompute(time.Now())
		case <-settle.C:
			l.recompute(time.Now())
		case <-t.C:
			beat()
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
	// Read by polling with direct gets, not watched: a watch creates a
	// consumer (see pollWatcher). A quarter of a Heartbeat keeps within
	// the assumption that every sender sees a heartbeat within one.
	w, err := watchByPolling(ctx, l.cfg.JetStream.Conn(), l.cfg.Bucket, l.cfg.Heartbeat/4)
	if err != nil {
		l.setDegraded(fmt.Errorf("read bucket %s: %w", l.cfg.Bucket, err))
		return nil
	}
	l.mu.Lock()
	l.kv = kv
	l.mu.Unlock()
	return w
}

// beat puts this sender's weight, and reports whether the bucket stored it.
// Only Run calls it (and recompute), so the weights said change in one
// goroutine.
func (l *Limiter) beat(ctx context.Context) bool {
	busy := l.cfg.Demand != nil && l.cfg.Demand() > 0
	now := time.Now()
	l.mu.Lock()
	kv := l.kv
	if kv == nil {
		l.mu.Unlock()
		return false
	}
	if busy {
		l.lastBusy = now
	}
	w := l.weight(now)
	if n := len(l.said); n > 0 && l.said[n-1].stored.IsZero() {
		// The last put failed: it may have been seen or not, so it counts
		// as said, and its weight and this one hold until this one settles.
		l.said[n-1].weight = min(l.said[n-1].weight, w)
	} else {
		l.said = append(l.said, announcement{weight: w})
	}
	l.mu.Unlock()
	hb := heartbeat{Weight: w, Demand: int(w) - 1}
	if l.cfg.Circuits != nil {
		hb.Circuits = l.cfg.Circuits()
	}
	b, _ := json.Marshal(hb)
	pctx, cancel := context.WithTimeout(ctx, l.cfg.Heartbeat)
	defer cancel()
	if _, err := kv.Put(pctx, "senders."+l.cfg.ID, b); err != nil {
		if ctx.Err() == nil {
			l.setDegraded(fmt.Errorf("put heartbeat: %w", err))
		}
		return false
	}
	l.mu.Lock()
	l.said[len(l.said)-1].stored = time.Now()
	l.mu.Unlock()
	return true
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
		w := hb.Weight
		if w <= 0 {
			w = 1 + float64(max(0, hb.Demand)) // a sender from before weights
		}
		l.peers[id] = peer{weight: max(idleWeight, w), seen: e.Created()}
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
	if !l.synced && now.Sub(l.started) <= l.cfg.LiveFor {
		// Not one look at the bucket yet: send nothing rather than guess.
		return
	}
	if !l.synced || now.Sub(l.lastEcho) > l.cfg.LiveFor {
		// The bucket is not answering: keep to the share of the senders
		// expected or last seen, never more.
		l.fallBack(now)
		if !l.degraded {
			l.degraded = true
			l.metrics.degraded.Set(1)
			l.log.Warn("shared rate limit unreachable; keeping to the fallback share",
				"senders_expected", l.cfg.ExpectedSenders, "senders_last_seen", l.lastLive, "rate", l.rate)
		}
		return
	}
	// A peer whose heartbeats stopped is gone, but only while this sender's
	// own heartbeats come back: when they are late too, the bucket is what
	// is slow, and the last view stands (so that a fallback counts the
	// senders that were really there).
	prune := now.Sub(l.lastEcho) <= 2*l.cfg.Heartbeat
	others := make([]float64, 0, len(l.peers))
	for id, p := range l.peers {
		if prune && now.Sub(p.seen) > l.cfg.LiveFor {
			delete(l.peers, id)
			continue
		}
		others = append(others, p.weight)
	}
	// This sender's weight: what it needs now, but no more than what the
	// others may still hold for it. Weights said before the latest settled
	// one are no longer needed.
	if k := settled(l.said, now, l.cfg.Heartbeat); k > 0 {
		l.said = append(l.said[:0], l.said[k:]...)
	}
	own := min(l.weight(now), usable(l.said, now, l.cfg.Heartbeat))
	l.refill(now)
	l.rate, l.capacity = split(l.cfg.Limit, l.cfg.Burst, own, others)
	l.tokens = min(l.tokens, l.capacity)
	l.lastLive = 1 + len(others)
	l.metrics.share.Set(l.rate)
	l.metrics.senders.Set(float64(l.lastLive))
	if l.degraded {
		l.degraded = false
		l.metrics.degraded.Set(0)
		l.log.Info("shared rate limit reachable again", "senders", l.lastLive)
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
