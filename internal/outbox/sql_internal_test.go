package outbox

import (
	"context"
	"io/fs"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

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
			if _, err := conn.PgConn().Prepare(ctx, "", sql, nil); err != nil {
				t.Errorf("sql/%s.sql, fill %d, does not prepare: %v", name, i, err)
				continue
			}
			prepared++
		}
	}
	t.Logf("prepared %d statements from %d files", prepared, len(files))
}
