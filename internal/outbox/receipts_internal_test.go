package outbox

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

// The receipts' duplicate probe looks each receipt up in sms_evidence
// through its index, whatever the table's statistics say. Here the table
// has grown to 3,000 rows since it was last analyzed (never): NOT EXISTS
// was planned as a hash of the whole table there, on every batch, which
// made each receipt cost about a quarter of a millisecond in make bench.
func TestApplyReceiptsLooksUpEvidenceByIndex(t *testing.T) {
	t.Parallel()
	pool, url := pgtest.NewPool(t)
	ctx := context.Background()
	ids := pgtest.LoadRows(t, pool, 3000, string(StatusSending))
	if _, err := pool.Exec(ctx, `INSERT INTO sms_evidence (outbox_id, kind, result, provider_ref, source)
		SELECT id, 'receipt', 'accepted', 'msg_' || id, 'generic' FROM sms_outbox`); err != nil {
		t.Fatal(err)
	}
	receipts := make([]Receipt, 40)
	for i := range receipts {
		receipts[i] = Receipt{ID: ids[i], Status: StatusDelivered, Source: "generic"}
	}
	// The statement runs inside sendonce_apply_receipts (migration 0018),
	// where EXPLAIN does not reach: auto_explain logs the plans of the
	// statements the function runs, and client_min_messages sends them to
	// this connection.
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		plans []string
	)
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		defer mu.Unlock()
		plans = append(plans, n.Message)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// The receiver's pool plans each execution for its parameters.
	for _, set := range []string{`SET plan_cache_mode = force_custom_plan`, `LOAD 'auto_explain'`,
		`SET auto_explain.log_min_duration = 0`, `SET auto_explain.log_nested_statements = on`,
		`SET client_min_messages = log`} {
		if _, err := conn.Exec(ctx, set); err != nil {
			t.Fatal(err)
		}
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := ApplyReceipts(ctx, tx, receipts); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	plan := strings.Join(plans, "\n")
	mu.Unlock()
	if !strings.Contains(plan, "INSERT INTO sms_evidence") {
		t.Fatalf("auto_explain logged no plan of the receipts' statement:\n%s", plan)
	}
	if strings.Contains(plan, "Seq Scan on sms_evidence") || !strings.Contains(plan, "sms_evidence_outbox_idx") {
		t.Fatalf("the receipts' duplicate probe does not use sms_evidence_outbox_idx:\n%s", plan)
	}
}
