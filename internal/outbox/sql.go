package outbox

import (
	"embed"
	"fmt"
	"strings"
)

// The package's SQL lives in sql/, one statement per file, named for what
// it does, so that a reader, an editor or a linter sees each statement as
// SQL rather than as a Go string. The files are embedded in the binary and
// read once, when the package is initialized, into the package variables
// the code runs (claimPendingSQL holds sql/claim_pending.sql): a call pays
// nothing for where its text came from, and the text is the one the
// constants held, but for each line's indentation.
//
// A file may start with comment lines ("--"), which say what the statement
// is for and what its placeholders stand for; they are the reader's, and
// are not sent to Postgres. A template's placeholder is written {{name}}:
// text no Postgres statement contains, so a template run unfilled fails at
// its first execution rather than doing something else. Its Go code fills
// it, with fill, from values of its own (never input): at initialization,
// where the fill is another file's statement (promote_due.sql holds
// due_scheduled.sql), or at each call, where it depends on the call (the
// console's optional conditions, an EXPLAIN's status literal).
//
// TestEveryStatementPrepares (sql_internal_test.go) prepares every file,
// templates with representative fills, against the migrated schema, and
// fails for a file no statement loads: a renamed column fails a test, not
// a production call.
//
// The only SQL left in Go strings is fragments that fill templates: the
// console's optional conditions (DeadFilter.statement), which fill the
// {{where}} of dead_rows.sql and dead_summary.sql with parameter numbers
// that depend on which are set, and unknown_rows.sql's two column lists
// (unknownRowsColumns, unknownRowsContent). The test prepares the
// templates filled by that very code.

//go:embed sql/*.sql
var sqlFiles embed.FS

// statements holds each file's text by its name (the file's name without
// sql/ and .sql), as stmt loaded it: the test's list of what to prepare,
// and its proof that every file is used.
var statements = map[string]string{}

// stmt returns the statement of sql/name.sql, without its leading comment
// lines and surrounding blank space. A file that is missing or empty fails
// the package's initialization, so that a misnamed statement stops every
// binary and test at once rather than one call in production.
func stmt(name string) string {
	if text, ok := statements[name]; ok {
		return text
	}
	b, err := sqlFiles.ReadFile("sql/" + name + ".sql")
	if err != nil {
		panic(fmt.Sprintf("outbox: statement %s: %v", name, err))
	}
	text := string(b)
	for strings.HasPrefix(text, "--") {
		_, text, _ = strings.Cut(text, "\n")
	}
	text = strings.TrimSpace(text)
	if text == "" {
		panic(fmt.Sprintf("outbox: statement %s: sql/%s.sql holds no statement", name, name))
	}
	statements[name] = text
	return text
}

// fill returns template with each placeholder {{key}} replaced by its
// value, given as key, value pairs. It panics when a key is not in the
// template or a placeholder is left unfilled: both are a mistake in this
// package's code, which only a test that never ran the call would miss.
func fill(template string, kv ...string) string {
	if len(kv)%2 != 0 {
		panic("outbox: fill: a key without a value")
	}
	for i := 0; i < len(kv); i += 2 {
		ph := "{{" + kv[i] + "}}"
		if !strings.Contains(template, ph) {
			panic(fmt.Sprintf("outbox: fill: no placeholder %s in %.60q", ph, template))
		}
		template = strings.ReplaceAll(template, ph, kv[i+1])
	}
	if i := strings.Index(template, "{{"); i >= 0 {
		panic(fmt.Sprintf("outbox: fill: a placeholder left unfilled at %.40q", template[i:]))
	}
	return template
}
