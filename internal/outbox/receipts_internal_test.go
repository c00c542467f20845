package outbox

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/pgtest"
)

// The receipts' duplicate probe looks each receipt up in sms_evidence
// through its index, whatever the table's statistics say. Here the table
// has grown to 3,000 rows since it was last analyzed (never): NOT EXISTS
// was planned as a hash of the whole table there, on every batch, which
// made each receipt cost about a quarter of a millisecond in make bench.
func TestApplyReceiptsLooksUpEvidenceByIndex(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	ids := pgtest.LoadRows(t, pool, 3000, string(StatusSending))
	if _, err := pool.Exec(ctx, `INSERT INTO sms_evidence (outbox_id, kind, result, provider_ref, source)
		SELECT id, 'receipt', 'accepted', 'msg_' || id, 'generic' FROM sms_outbox`); err != nil {
		t.Fatal(err)
	}
	n := 40
	statuses, refs, codes, ats, sources := make([]string, n), make([]*string, n), make([]*int32, n), make([]*time.Time, n), make([]string, n)
	for i := range n {
		statuses[i], sources[i] = string(StatusDelivered), "generic"
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// The receiver's pool plans each execution for its parameters.
	if _, err := conn.Exec(ctx, `SET plan_cache_mode = force_custom_plan`); err != nil {
		t.Fatal(err)
	}
	plan := pgtest.Explain(t, conn, applyReceiptsSQL, uuidArray(ids[:n]), statuses, refs, codes, ats, sources)
	if strings.Contains(plan, "Seq Scan on sms_evidence") || !strings.Contains(plan, "sms_evidence_outbox_idx") {
		t.Fatalf("the receipts' duplicate probe does not use sms_evidence_outbox_idx:\n%s", plan)
	}
}
