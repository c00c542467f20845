package outbox

import (
	"context"
	"io/fs"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sendonce/sendonce/internal/testing/pgtest"
)

// templateFills gives, for each template of sql/ (a file with a {{name}}
// placeholder), the statements its Go code makes of it: the same fills the
// code makes, through the same functions where it has them, so that the
// test prepares what production runs. A template without an entry here
// fails the test, and so does an entry without its template.
var templateFills = map[string]func(template string) []string{
	"promote_due": func(t string) []string { return []string{fill(t, "due", dueScheduledSQL)} },
	"expire_due":  func(t string) []string { return []string{fill(t, "due", dueExpiringSQL)} },
	"unknown_rows": func(t string) []string {
		return []string{fill(t, "columns", unknownRowsColumns), fill(t, "columns", unknownRowsContent)}
	},
	"estimate_status": func(t string) []string {
		var out []string
		for _, s := range ConsoleStatuses {
			out = append(out, fill(t, "status", string(s)))
		}
		return out
	},
	"dead_rows":    deadFilterFills,
	"dead_summary": deadFilterFills,
}

// deadFilterFills fills a template of the console's dead rows as
// DeadFilter.statement does, with no condition set and with every one.
func deadFilterFills(t string) []string {
	code := 21610
	none, _ := DeadFilter{}.statement(t, 50)
	all, _ := DeadFilter{Reason: "permanent", Since: time.Now().Add(-time.Hour), Until: time.Now(), ProviderCode: &code}.statement(t, 50)
	return []string{none, all}
}

// sameColumns lists pairs of statements whose results the code reads into
// the same variables, so that they must return columns of the same types,
// but for the columns of a at the indexes drop (which b leaves out): a
// column added to one and not the other fails here rather than in a Scan.
var sameColumns = []struct {
	a, b string
	drop []int
}{
	{"get_row", "get_row_without_content", []int{2, 3}},
	{"replay_lock_rows", "replay_lock_rows_console", nil},
	{"console_replays", "console_replays_of_row", nil},
	{"apply_sends", "apply_sends_named", nil},
	{"apply_sends", "apply_results", nil},
	{"apply_sends", "requeue_unlisted", nil},
	{"count_pending", "count_scheduled", nil},
	{"count_pending", "count_queued", nil},
	{"count_pending", "count_sending", nil},
}

// Every statement of the package's sql/ directory prepares on the
// migrated schema: Postgres parses and analyzes it (every table, column,
// function and type it names must exist, and every parameter's type must
// be known), without running it. A migration that renames or drops what a
// statement uses fails here rather than at the statement's first call in
// production. The test also fails for a file that no package variable
// loads (a statement the code no longer runs, or loads only lazily, where
// it would escape this test), so it cannot pass by preparing nothing.
func TestEveryStatementPrepares(t *testing.T) {
	t.Parallel()
	files, err := fs.Glob(sqlFiles, "sql/*.sql")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no statement is embedded from sql/")
	}
	for _, f := range files {
		name := strings.TrimSuffix(strings.TrimPrefix(f, "sql/"), ".sql")
		if _, ok := statements[name]; !ok {
			t.Errorf("%s is embedded but no package variable loads it (stmt(%q))", f, name)
		}
	}
	if len(statements) != len(files) {
		t.Errorf("%d statements loaded from %d files", len(statements), len(files))
	}
	for name := range templateFills {
		if !strings.Contains(statements[name], "{{") {
			t.Errorf("templateFills names %s, which is not a template of sql/", name)
		}
	}

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.NewMigrated(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	names := make([]string, 0, len(statements))
	for name := range statements {
		names = append(names, name)
	}
	slices.Sort(names)
	prepared := 0
	fields := map[string][]pgconn.FieldDescription{}
	for _, name := range names {
		variants := []string{statements[name]}
		if strings.Contains(statements[name], "{{") {
			fills, ok := templateFills[name]
			if !ok {
				t.Errorf("sql/%s.sql is a template, and templateFills gives no fill of it", name)
				continue
			}
			variants = fills(statements[name])
		}
		for i, sql := range variants {
			if strings.Contains(sql, "{{") {
				t.Errorf("sql/%s.sql, fill %d: a placeholder left unfilled", name, i)
				continue
			}
			// The unnamed statement: Parse and Describe, nothing run.
			sd, err := conn.PgConn().Prepare(ctx, "", sql, nil)
			if err != nil {
				t.Errorf("sql/%s.sql, fill %d, does not prepare: %v", name, i, err)
				continue
			}
			if i == 0 {
				fields[name] = sd.Fields
			}
			prepared++
		}
	}
	for _, p := range sameColumns {
		a, b := columns(fields[p.a]), columns(fields[p.b])
		if len(a) == 0 && len(b) == 0 {
			t.Errorf("%s and %s: neither returns a column (or prepares)", p.a, p.b)
		}
		for _, i := range slices.Backward(p.drop) {
			if i < len(a) {
				a = slices.Delete(a, i, i+1)
			}
		}
		if !slices.Equal(a, b) {
			t.Errorf("%s returns %v, %s returns %v", p.a, a, p.b, b)
		}
	}
	t.Logf("prepared %d statements from %d files", prepared, len(files))
}

// columns gives the types' OIDs of a statement's result columns.
func columns(fs []pgconn.FieldDescription) []uint32 {
	out := make([]uint32, len(fs))
	for i, f := range fs {
		out[i] = f.DataTypeOID
	}
	return out
}
