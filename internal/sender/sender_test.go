package sender_test

import (
	"context"
	"math"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sendonce/sendonce/internal/provider"
	"github.com/sendonce/sendonce/internal/sender"
	"github.com/sendonce/sendonce/internal/testing/natstest"
)

// wantCeiling is min(cap, base*2^attempt), computed without overflow; an
// attempt below 0 counts as 0.
func wantCeiling(attempt int, base, cap time.Duration) time.Duration {
	attempt = max(attempt, 0)
	if attempt >= 64 {
		return cap
	}
	p := new(big.Int).Lsh(big.NewInt(int64(base)), uint(attempt))
	if p.Cmp(big.NewInt(int64(cap))) >= 0 {
		return cap
	}
	return time.Duration(p.Int64())
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	const samples = 400
	shapes := []struct{ base, cap time.Duration }{
		{500 * time.Millisecond, 60 * time.Second}, // the defaults
		{100 * time.Millisecond, 2 * time.Second},
		{time.Second, time.Second},
		{time.Millisecond, 30 * 24 * time.Hour},
		{time.Second, 1 << 62}, // a cap so large that base*2^attempt overflows first
		{3, 1 << 62},
	}
	attempts := []int{math.MinInt, -1, 0, 1, 2, 3, 7, 10, 20, 30, 33, 34, 35, 40, 50, 55, 60, 61, 62, 63, 64, 65, 100, 1000, math.MaxInt}
	for _, sh := range shapes {
		for _, attempt := range attempts {
			ceiling := wantCeiling(attempt, sh.base, sh.cap)
			lo, hi := ceiling, time.Duration(0)
			distinct := map[time.Duration]bool{}
			for range samples {
				d := sender.Backoff(attempt, sh.base, sh.cap)
				// U(0, ceiling), shifted by the 1ms floor.
				if d < time.Millisecond || d > ceiling+time.Millisecond {
					t.Fatalf("Backoff(%d, %s, %s) = %s, outside [1ms, %s+1ms]", attempt, sh.base, sh.cap, d, ceiling)
				}
				lo, hi = min(lo, d), max(hi, d)
				distinct[d] = true
			}
			// Full jitter spreads over the whole range: with 400 samples the
			// chance of missing either quarter is below 1e-49.
			if ceiling >= 100 {
				if lo > ceiling/4+time.Millisecond || hi < ceiling*3/4 {
					t.Errorf("Backoff(%d, %s, %s) stayed within [%s, %s] of [0, %s]", attempt, sh.base, sh.cap, lo, hi, ceiling)
				}
				if len(distinct) < samples/2 {
					t.Errorf("Backoff(%d, %s, %s) gave only %d distinct values in %d", attempt, sh.base, sh.cap, len(distinct), samples)
				}
			}
		}
	}
}

func TestBackoffGrowsToTheCap(t *testing.T) {
	t.Parallel()
	base, cap := 500*time.Millisecond, 60*time.Second
	// The largest of many draws approaches each attempt's ceiling: 1s, 2s,
	// 4s, ... then the cap.
	for attempt := 1; attempt <= 10; attempt++ {
		ceiling := wantCeiling(attempt, base, cap)
		var hi time.Duration
		for range 300 {
			hi = max(hi, sender.Backoff(attempt, base, cap))
		}
		if hi < ceiling*9/10 || hi > ceiling+time.Millisecond {
			t.Errorf("attempt %d: largest of 300 delays %s, want close below %s", attempt, hi, ceiling)
		}
	}
}

// setup returns a valid Config on real but unused dependencies: a pool that
// has not connected (pgxpool connects lazily; nothing listens on port 1), a
// JetStream on an embedded server, and a provider client.
func setup(t *testing.T) sender.Config {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), "postgres://sendonce@127.0.0.1:1/nothing?connect_timeout=1")
	if err != nil {
		t.Fatalf("pgxpool.New: %v", err)
	}
	t.Cleanup(pool.Close)
	_, js := natstest.Start(t).Connect(t)
	p, err := provider.New(provider.Config{BaseURL: "http://127.0.0.1:1", Timeout: 2 * time.Second})
	if err != nil {
		t.Fatalf("provider.New: %v", err)
	}
	return sender.Config{Pool: pool, JetStream: js, Provider: p}
}

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	valid := setup(t)
	tests := []struct {
		name string
		mod  func(c *sender.Config)
		want string // substring of the error; "" means valid
	}{
		{name: "defaults", mod: func(*sender.Config) {}},
		{name: "nil pool", mod: func(c *sender.Config) { c.Pool = nil }, want: "Pool"},
		{name: "nil JetStream", mod: func(c *sender.Config) { c.JetStream = nil }, want: "JetStream"},
		{name: "nil provider", mod: func(c *sender.Config) { c.Provider = nil }, want: "Provider"},
		{name: "concurrency 1", mod: func(c *sender.Config) { c.Concurrency = 1 }},
		{name: "concurrency 10000", mod: func(c *sender.Config) { c.Concurrency = 10000 }},
		{name: "negative concurrency", mod: func(c *sender.Config) { c.Concurrency = -1 }, want: "Concurrency"},
		{name: "concurrency too large", mod: func(c *sender.Config) { c.Concurrency = 10001 }, want: "Concurrency"},
		{name: "negative claim batch", mod: func(c *sender.Config) { c.ClaimBatch = -1 }, want: "ClaimBatch"},
		{name: "negative write batch", mod: func(c *sender.Config) { c.WriteBatch = -5 }, want: "WriteBatch"},
		{name: "lease just above the timeout", mod: func(c *sender.Config) { c.Lease = 2*time.Second + 1 }},
		{name: "lease equal to the timeout", mod: func(c *sender.Config) { c.Lease = 2 * time.Second }, want: "Lease"},
		{name: "lease below the timeout", mod: func(c *sender.Config) { c.Lease = time.Second }, want: "Lease"},
		{name: "negative lease", mod: func(c *sender.Config) { c.Lease = -time.Minute }, want: "Lease"},
		{name: "retry cap equal to base", mod: func(c *sender.Config) { c.RetryBase, c.RetryCap = time.Second, time.Second }},
		{name: "retry cap below base", mod: func(c *sender.Config) { c.RetryBase, c.RetryCap = 2*time.Second, time.Second }, want: "RetryCap"},
		{name: "retry cap below the default base", mod: func(c *sender.Config) { c.RetryCap = time.Millisecond }, want: "RetryCap"},
		{name: "negative retry base", mod: func(c *sender.Config) { c.RetryBase = -time.Second }, want: "RetryBase"},
		{name: "negative DB timeout", mod: func(c *sender.Config) { c.DBTimeout = -time.Second }, want: "DBTimeout"},
		{name: "negative publish timeout", mod: func(c *sender.Config) { c.PublishTimeout = -time.Second }, want: "PublishTimeout"},
		{name: "registerer", mod: func(c *sender.Config) { c.Registerer = prometheus.NewRegistry() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := valid
			tt.mod(&cfg)
			s, err := sender.New(cfg)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("New: %v", err)
			case tt.want == "" && s == nil:
				t.Fatal("New returned neither a Sender nor an error")
			case tt.want != "" && err == nil:
				t.Fatalf("New accepted the config, want an error naming %s", tt.want)
			case tt.want != "" && !strings.Contains(err.Error(), tt.want):
				t.Errorf("error %q does not name %s", err, tt.want)
			}
		})
	}
}

func TestNewRefusesADuplicateRegistration(t *testing.T) {
	t.Parallel()
	cfg := setup(t)
	cfg.Registerer = prometheus.NewRegistry()
	if _, err := sender.New(cfg); err != nil {
		t.Fatalf("first New: %v", err)
	}
	if _, err := sender.New(cfg); err == nil || !strings.Contains(err.Error(), "metrics") {
		t.Errorf("second New on the same registry = %v, want a metrics registration error", err)
	}
}
