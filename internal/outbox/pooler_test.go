package outbox_test

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/sendonce/sendonce/internal/outbox"
)

// What each pooler allows: a startup parameter only directly, a SET once
// connected through a session pooler, and through a transaction pooler
// neither, with statements sent unnamed and no generic-plan tuning (a
// session setting) at all.
func TestPoolConfigPerPooler(t *testing.T) {
	const dsn = "postgres://u@127.0.0.1:5432/db"
	for _, tt := range []struct {
		pooler      outbox.Pooler
		param       bool
		setOnStart  bool
		mode        pgx.QueryExecMode
		genericPlan bool
	}{
		{outbox.NoPooler, true, false, pgx.QueryExecModeCacheStatement, true},
		{outbox.SessionPooler, false, true, pgx.QueryExecModeCacheStatement, true},
		{outbox.TransactionPooler, false, false, pgx.QueryExecModeCacheDescribe, false},
	} {
		t.Run(string(tt.pooler), func(t *testing.T) {
			cfg, err := outbox.PoolConfig(dsn, tt.pooler)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := cfg.ConnConfig.RuntimeParams["plan_cache_mode"]; ok != tt.param {
				t.Errorf("plan_cache_mode startup parameter: %v, want %v", ok, tt.param)
			}
			if (cfg.AfterConnect != nil) != tt.setOnStart {
				t.Errorf("a SET once connected: %v, want %v", cfg.AfterConnect != nil, tt.setOnStart)
			}
			if cfg.ConnConfig.DefaultQueryExecMode != tt.mode {
				t.Errorf("exec mode %v, want %v", cfg.ConnConfig.DefaultQueryExecMode, tt.mode)
			}
			outbox.AllowGenericPlans(cfg, 0)
			if (cfg.PrepareConn != nil) != tt.genericPlan {
				t.Errorf("generic-plan tuning: %v, want %v", cfg.PrepareConn != nil, tt.genericPlan)
			}
		})
	}
	// A DSN's own plan_cache_mode: a startup parameter directly, a SET
	// through a session pooler, refused for a transaction pooler.
	const own = "postgres://u@127.0.0.1:5432/db?plan_cache_mode=auto"
	if cfg, err := outbox.PoolConfig(own, outbox.NoPooler); err != nil || cfg.ConnConfig.RuntimeParams["plan_cache_mode"] != "auto" {
		t.Fatalf("directly: %v, %v", cfg.ConnConfig.RuntimeParams, err)
	}
	if cfg, err := outbox.PoolConfig(own, outbox.SessionPooler); err != nil || cfg.ConnConfig.RuntimeParams["plan_cache_mode"] != "" || cfg.AfterConnect == nil {
		t.Fatalf("through a session pooler: the parameter stays a startup parameter (%v, %v)", cfg.ConnConfig.RuntimeParams, err)
	}
	if _, err := outbox.PoolConfig(own, outbox.TransactionPooler); !errors.Is(err, outbox.ErrSessionSetting) {
		t.Fatalf("through a transaction pooler: %v, want ErrSessionSetting", err)
	}
}
