package migrate

import "strings"

// noTxDirective, as the first line of a migration file, makes it run
// outside a transaction, one statement at a time.
const noTxDirective = "-- sendonce:no-transaction"

// NoTransaction reports whether the SQL text of a migration file asks to run
// outside a transaction: its first line is "-- sendonce:no-transaction".
func NoTransaction(sql string) bool {
	first, _, _ := strings.Cut(strings.TrimLeft(sql, " \t\r\n"), "\n")
	return strings.TrimSpace(first) == noTxDirective
}

// Split cuts an SQL script into its statements at the semicolons that end
// them, the way psql does: a semicolon inside a quoted string, a quoted
// identifier, a dollar-quoted body or a comment does not end a statement.
// Statements holding nothing but comments and space are dropped.
//
// A no-transaction migration needs it because Postgres runs a script sent as
// one query in one implicit transaction, where CREATE INDEX CONCURRENTLY is
// refused.
func Split(sql string) []string {
	var out []string
	start := 0
	onlyComments := true // the current statement has no code yet
	emit := func(end int) {
		if !onlyComments {
			if s := strings.TrimSpace(sql[start:end]); s != "" {
				out = append(out, s)
			}
		}
		start, onlyComments = end+1, true
	}
	for i := 0; i < len(sql); {
		c := sql[i]
		switch {
		case c == '-' && strings.HasPrefix(sql[i:], "--"):
			j := strings.IndexByte(sql[i:], '\n')
			if j < 0 {
				i = len(sql)
			} else {
				i += j + 1
			}
		case c == '/' && strings.HasPrefix(sql[i:], "/*"):
			// Block comments nest in Postgres.
			depth := 0
			for i < len(sql) {
				if strings.HasPrefix(sql[i:], "/*") {
					depth++
					i += 2
				} else if strings.HasPrefix(sql[i:], "*/") {
					depth--
					i += 2
					if depth == 0 {
						break
					}
				} else {
					i++
				}
			}
		case c == '\'':
			onlyComments = false
			escapes := i > 0 && (sql[i-1] == 'E' || sql[i-1] == 'e') && (i < 2 || !isIdent(sql[i-2]))
			i = skipQuoted(sql, i, '\'', escapes)
		case c == '"':
			onlyComments = false
			i = skipQuoted(sql, i, '"', false)
		case c == '$' && (i == 0 || !isIdent(sql[i-1])):
			onlyComments = false
			if tag, ok := dollarTag(sql[i:]); ok {
				end := strings.Index(sql[i+len(tag):], tag)
				if end < 0 {
					i = len(sql)
				} else {
					i += len(tag) + end + len(tag)
				}
			} else {
				i++
			}
		case c == ';':
			emit(i)
			i++
		default:
			if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
				onlyComments = false
			}
			i++
		}
	}
	emit(len(sql))
	return out
}

// skipQuoted returns the index just past the quoted text starting at
// sql[i] == q. A doubled quote stands for itself; with escapes (an E'...'
// string) so does a backslash-escaped one.
func skipQuoted(sql string, i int, q byte, escapes bool) int {
	for i++; i < len(sql); i++ {
		switch {
		case escapes && sql[i] == '\\':
			i++
		case sql[i] == q:
			if i+1 < len(sql) && sql[i+1] == q {
				i++
				continue
			}
			return i + 1
		}
	}
	return len(sql)
}

// dollarTag returns the opening "$tag$" at the start of s, if there is one.
// "$1" (a parameter) is not one.
func dollarTag(s string) (string, bool) {
	for j := 1; j < len(s); j++ {
		switch c := s[j]; {
		case c == '$':
			return s[:j+1], true
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80:
		case c >= '0' && c <= '9' && j > 1:
		default:
			return "", false
		}
	}
	return "", false
}

func isIdent(c byte) bool {
	return c == '_' || c == '$' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c >= 0x80
}

// concurrently reports whether stmt builds or drops an index CONCURRENTLY.
// Such a statement never blocks writes, but waits for every transaction that
// could use the table: a lock timeout would only make it fail (and leave an
// invalid index behind) under ordinary traffic.
func concurrently(stmt string) bool {
	for _, f := range strings.Fields(strings.ToUpper(stmt)) {
		if f == "CONCURRENTLY" {
			return true
		}
	}
	return false
}
