package migrate_test

import (
	"slices"
	"testing"

	"github.com/sendonce/sendonce"
	"github.com/sendonce/sendonce/internal/migrate"
)

func TestSplit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		sql  string
		want []string
	}{
		{"two statements", "SELECT 1; SELECT 2;", []string{"SELECT 1", "SELECT 2"}},
		{"no final semicolon", "SELECT 1;\nSELECT 2", []string{"SELECT 1", "SELECT 2"}},
		{"comments only are dropped", "-- a comment; with a semicolon\n/* another; */\n", nil},
		{"line comment with semicolon", "SELECT 1 -- not; the end\n+ 1;", []string{"SELECT 1 -- not; the end\n+ 1"}},
		{"nested block comment", "SELECT /* a /* b; */ c; */ 1; SELECT 2", []string{"SELECT /* a /* b; */ c; */ 1", "SELECT 2"}},
		{"string with semicolon and doubled quote", "SELECT 'a;''b'; SELECT 2", []string{"SELECT 'a;''b'", "SELECT 2"}},
		{"escape string", `SELECT E'a\';b'; SELECT 2`, []string{`SELECT E'a\';b'`, "SELECT 2"}},
		{"quoted identifier", `SELECT 1 AS "x;y"; SELECT 2`, []string{`SELECT 1 AS "x;y"`, "SELECT 2"}},
		{"dollar quoted body", "DO $$ BEGIN PERFORM 1; END $$; SELECT 2", []string{"DO $$ BEGIN PERFORM 1; END $$", "SELECT 2"}},
		{"tagged dollar quote", "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $fn$ SELECT 1; $fn$; SELECT 2",
			[]string{"CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $fn$ SELECT 1; $fn$", "SELECT 2"}},
		{"parameter is not a dollar quote", "SELECT $1; SELECT 2", []string{"SELECT $1", "SELECT 2"}},
		{"leading comment kept with its statement", "-- why\nSELECT 1;", []string{"-- why\nSELECT 1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := migrate.Split(tt.sql); !slices.Equal(got, tt.want) {
				t.Fatalf("Split(%q) = %q, want %q", tt.sql, got, tt.want)
			}
		})
	}
}

func TestNoTransaction(t *testing.T) {
	t.Parallel()
	for sql, want := range map[string]bool{
		"-- sendonce:no-transaction\nCREATE INDEX CONCURRENTLY x ON t (a);": true,
		"\n  -- sendonce:no-transaction  \r\nSELECT 1":                      true,
		"-- comment\n-- sendonce:no-transaction\nSELECT 1":                  false,
		"SELECT 1": false,
	} {
		if got := migrate.NoTransaction(sql); got != want {
			t.Errorf("NoTransaction(%q) = %v, want %v", sql, got, want)
		}
	}
	// The shipped files that build indexes concurrently say so: a
	// CONCURRENTLY statement in a transaction fails.
	migs, err := migrate.Load(sendonce.Migrations, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range migs {
		for dir, sql := range map[string]string{"up": m.Up, "down": m.Down} {
			for _, stmt := range migrate.Split(sql) {
				if containsWord(stmt, "CONCURRENTLY") && !migrate.NoTransaction(sql) {
					t.Errorf("%04d_%s.%s.sql builds an index CONCURRENTLY but is not marked -- sendonce:no-transaction", m.Version, m.Name, dir)
				}
			}
		}
	}
}
