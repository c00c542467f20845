package flow

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sendonce/sendonce/internal/directget"
)

// pollWatcher follows the bucket as a KeyWatcher does, without a consumer:
// every interval it reads the last value of each key with one direct get
// (multi_last, nats-server 2.11 and later) and sends each key whose
// revision changed, and a nil entry after the first full read. A watch
// would create an ordered push consumer, and a user that may create
// consumers on the bucket's stream may create one delivering on any
// subject (nats-server does not check a deliver subject against its
// creator's permissions): sms.send included. So the senders read the
// bucket with direct gets only, which need $JS.API.DIRECT.GET.KV_<bucket>.
//
// A key whose value aged out (the bucket's TTL) is not reported, as a
// watch would not either; liveness is decided by the heartbeats' times.
type pollWatcher struct {
	updates chan jetstream.KeyValueEntry
	cancel  context.CancelFunc
	done    chan struct{}
	once    sync.Once
}

// watchByPolling starts a pollWatcher on bucket, reading every interval.
// The first read happens before it returns: an error then (no bucket, no
// permission) is returned, and nothing runs.
func watchByPolling(ctx context.Context, nc *nats.Conn, bucket string, interval time.Duration) (*pollWatcher, error) {
	stream := "KV_" + bucket
	prefix := "$KV." + bucket + "."
	seen := map[string]uint64{}
	read := func(ctx context.Context) ([]jetstream.KeyValueEntry, error) {
		rctx, cancel := context.WithTimeout(ctx, max(interval, time.Second))
		defer cancel()
		msgs, err := directget.Get(rctx, nc, stream, directget.Request{MultiLastFor: []string{prefix + ">"}})
		if errors.Is(err, directget.ErrNoMessages) {
			msgs, err = nil, nil
		}
		if err != nil {
			return nil, err
		}
		var out []jetstream.KeyValueEntry
		for _, m := range msgs {
			key, ok := strings.CutPrefix(m.Subject, prefix)
			if !ok || seen[key] == m.Seq {
				continue
			}
			seen[key] = m.Seq
			e := &polledEntry{bucket: bucket, key: key, value: m.Data, revision: m.Seq, created: m.Time, op: jetstream.KeyValuePut}
			switch m.Header.Get("KV-Operation") {
			case "DEL":
				e.op = jetstream.KeyValueDelete
			case "PURGE":
				e.op = jetstream.KeyValuePurge
			}
			out = append(out, e)
		}
		return out, nil
	}
	first, err := read(ctx)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	w := &pollWatcher{updates: make(chan jetstream.KeyValueEntry, 64), cancel: cancel, done: make(chan struct{})}
	send := func(e jetstream.KeyValueEntry) bool {
		select {
		case w.updates <- e:
			return true
		case <-wctx.Done():
			return false
		}
	}
	go func() {
		defer close(w.done)
		defer close(w.updates)
		for _, e := range first {
			if !send(e) {
				return
			}
		}
		if !send(nil) {
			return
		}
		t := time.NewTicker(interval)
		defer t.Stop()
		failures := 0
		for {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
			}
			entries, err := read(wctx)
			if err != nil {
				// A read lost now and then is a late update; several in
				// a row end the watch, and Run starts it again.
				if failures++; failures >= 3 {
					return
				}
				continue
			}
			failures = 0
			for _, e := range entries {
				if !send(e) {
					return
				}
			}
		}
	}()
	return w, nil
}

func (w *pollWatcher) Updates() <-chan jetstream.KeyValueEntry { return w.updates }

func (w *pollWatcher) Stop() error {
	w.once.Do(func() {
		w.cancel()
		// Drain, so that the goroutine is never stuck on a send.
		go func() {
			for range w.updates {
			}
		}()
		<-w.done
	})
	return nil
}

// polledEntry is a key's last value as a direct get returned it.
type polledEntry struct {
	bucket, key string
	value       []byte
	revision    uint64
	created     time.Time
	op          jetstream.KeyValueOp
}

func (e *polledEntry) Bucket() string                  { return e.bucket }
func (e *polledEntry) Key() string                     { return e.key }
func (e *polledEntry) Value() []byte                   { return e.value }
func (e *polledEntry) Revision() uint64                { return e.revision }
func (e *polledEntry) Created() time.Time              { return e.created }
func (e *polledEntry) Delta() uint64                   { return 0 }
func (e *polledEntry) Operation() jetstream.KeyValueOp { return e.op }

// Circuit is one provider's circuit as the senders last reported it.
type Circuit struct {
	// Provider names it.
	Provider string
	// Closed, HalfOpen and Open count the live senders whose circuit of
	// the provider is in that state.
	Closed, HalfOpen, Open int
}

// ReadCircuits reads the provider circuits the live senders report in
// their heartbeats in bucket (DefaultBucket when empty): those whose
// heartbeat is younger than liveFor. It needs only a direct get of the
// bucket's stream.
func ReadCircuits(ctx context.Context, nc *nats.Conn, bucket string, liveFor time.Duration) ([]Circuit, error) {
	bucket = cmp.Or(bucket, DefaultBucket)
	prefix := "$KV." + bucket + ".senders."
	msgs, err := directget.Get(ctx, nc, "KV_"+bucket, directget.Request{MultiLastFor: []string{prefix + ">"}})
	if errors.Is(err, directget.ErrNoMessages) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	by := map[string]*Circuit{}
	for _, m := range msgs {
		if m.Header.Get("KV-Operation") != "" || time.Since(m.Time) > liveFor {
			continue
		}
		var hb heartbeat
		if json.Unmarshal(m.Data, &hb) != nil {
			continue
		}
		for p, st := range hb.Circuits {
			c := by[p]
			if c == nil {
				c = &Circuit{Provider: p}
				by[p] = c
			}
			switch st {
			case "closed":
				c.Closed++
			case "half-open":
				c.HalfOpen++
			default:
				c.Open++
			}
		}
	}
	out := make([]Circuit, 0, len(by))
	for _, c := range by {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b Circuit) int { return strings.Compare(a.Provider, b.Provider) })
	return out, nil
}
