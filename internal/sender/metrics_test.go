package sender_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sendonce/sendonce/internal/sender"
)

// The sender's metrics pass the Prometheus linter; their only labels are
// outcome classes and dead-letter reasons, never per-message values.
func TestMetricsLint(t *testing.T) {
	t.Parallel()
	cfg := setup(t)
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	if _, err := sender.New(cfg); err != nil {
		t.Fatal(err)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
}
