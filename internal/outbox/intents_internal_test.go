package outbox

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

// The relay's pass over scheduled and expiring rows reads the due entries
// of their indexes, never the rows still to come: 100,000 rows scheduled
// for tomorrow and as many expiring tomorrow cost each pass a few pages.
// (clock_timestamp() in the conditions made each pass read them all.)
func TestTheTimePassReadsOnlyWhatIsDue(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	for _, q := range []string{
		`INSERT INTO sms_outbox (id, to_e164, body, send_at)
		 SELECT gen_random_uuid(), '+1555' || lpad(i::text, 7, '0'), 'tomorrow', now() + interval '1 day' FROM generate_series(1, 100000) i`,
		`INSERT INTO sms_outbox (id, to_e164, body, expires_at, status)
		 SELECT gen_random_uuid(), '+1556' || lpad(i::text, 7, '0'), 'later', now() + interval '1 day', 'queued' FROM generate_series(1, 100000) i`,
		`VACUUM ANALYZE sms_outbox`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	for name, q := range map[string]string{"promote": dueScheduledSQL, "expire": dueExpiringSQL} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var plan string
		err = tx.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+q, 500).Scan(&plan)
		_ = tx.Rollback(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []struct {
			Plan struct {
				Hit  int64 `json:"Shared Hit Blocks"`
				Read int64 `json:"Shared Read Blocks"`
			} `json:"Plan"`
		}
		if err := json.Unmarshal([]byte(plan), &out); err != nil || len(out) != 1 {
			t.Fatalf("plan %q: %v", plan, err)
		}
		if n := out[0].Plan.Hit + out[0].Plan.Read; n > 50 {
			t.Errorf("%s: %d buffers with nothing due; want the index's first pages only\n%s", name, n, plan)
		}
	}
}
