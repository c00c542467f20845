package sender_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// A message finished without a provider call (here: one that did not come
// from the relay) is a decision, not an attempt: the attempts counter, which
// error ratios are computed over, counts only calls made.
func TestDecisionsAreNotAttempts(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	s, js := cutOffSender(t, reg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	if _, err := js.Publish(context.Background(), "sms.send", []byte("not a relay message")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for counterValue(t, reg, "sendonce_dead_letters_total", "invalid") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the foreign message was not dead-lettered")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := counterValue(t, reg, "sendonce_sender_decisions_total", "invalid"); got != 1 {
		t.Errorf("decisions{invalid} = %v, want 1", got)
	}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "sendonce_sender_attempts_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if v := m.GetCounter().GetValue(); v != 0 {
				t.Errorf("attempts %v = %v, want 0: no provider call was made", m.GetLabel(), v)
			}
		}
	}
}

// counterValue returns the value of the counter name{label} in reg (0 when
// absent).
func counterValue(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == label {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
