package relay_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sendonce/sendonce/internal/relay"
	"github.com/sendonce/sendonce/internal/testing/testkit"
)

// The batch duration histogram reaches past the longest a batch may take
// (claim + AckTimeout + mark): a batch that waits out its PubAcks lands in a
// bucket, not in +Inf. Before: the top bucket was 8.192s under a 10s
// AckTimeout.
func TestBatchHistogramReachesPastTheAckTimeout(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, c := range []struct{ ack, db time.Duration }{{10 * time.Second, 10 * time.Second}, {time.Minute, 10 * time.Second}, {100 * time.Millisecond, 100 * time.Millisecond}} {
		reg := prometheus.NewRegistry()
		e.newRelay(t, relay.Config{AckTimeout: c.ack, DBTimeout: c.db, Registerer: reg})
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		top := 0.0
		for _, mf := range mfs {
			if mf.GetName() == "sendonce_relay_batch_duration_seconds" {
				for _, b := range mf.GetMetric()[0].GetHistogram().GetBucket() {
					top = max(top, b.GetUpperBound())
				}
			}
		}
		if bound := (c.db + c.ack + c.db).Seconds(); top < bound {
			t.Errorf("AckTimeout %s, DBTimeout %s: top bucket %gs, below the batch bound %gs", c.ack, c.db, top, bound)
		}
	}
}

// Publish errors count the publications not acknowledged, not the batches
// they were in; the failed batches have a counter of their own.
func TestPublishErrorsCountMessages(t *testing.T) {
	t.Parallel()
	e := setup(t)
	reg := prometheus.NewRegistry()
	// Every publication expects a stream that does not hold the subject:
	// JetStream refuses each one.
	r := e.newRelay(t, relay.Config{Stream: "NOT_SMS", AckTimeout: 5 * time.Second, Registerer: reg})
	e.insert(t, 7)
	if _, err := r.RelayBatch(context.Background()); err == nil {
		t.Fatal("a batch whose publications were all refused succeeded")
	}
	if got := counter(t, reg, "sendonce_relay_publish_errors_total"); got != 7 {
		t.Fatalf("publish errors = %v after one batch of 7 refused publications, want 7", got)
	}
	if got := counter(t, reg, "sendonce_relay_published_total"); got != 0 {
		t.Fatalf("published = %v, want 0", got)
	}
}

// Readiness follows the relay's own batches: not ready before the first,
// ready while they succeed, unready once they have failed for longer than a
// batch may take, ready again when they recover. Nothing is pinged.
func TestReadyFollowsTheBatches(t *testing.T) {
	t.Parallel()
	e := setup(t)
	reg := prometheus.NewRegistry()
	r := e.newRelay(t, relay.Config{DBTimeout: 200 * time.Millisecond, AckTimeout: 200 * time.Millisecond, PollInterval: 50 * time.Millisecond, Registerer: reg})
	if err := r.Ready(); err == nil {
		t.Fatal("ready before any batch")
	}
	var failing atomic.Bool
	relay.SetAfterAcksForTest(r, func() error {
		if failing.Load() {
			return errors.New("simulated failure after the PubAcks")
		}
		return nil
	})
	run(t, r)
	testkit.WaitFor(t, 20*time.Second, "ready after the first batch", func() bool { return r.Ready() == nil })
	failing.Store(true)
	e.insert(t, 3) // every batch now claims these and fails
	testkit.WaitFor(t, 20*time.Second, "unready while every batch fails", func() bool { return r.Ready() != nil })
	if counter(t, reg, "sendonce_relay_batch_errors_total") == 0 {
		t.Fatal("failed batches not counted")
	}
	failing.Store(false)
	testkit.WaitFor(t, 20*time.Second, "ready again once batches succeed", func() bool { return r.Ready() == nil })
}
