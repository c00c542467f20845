package outbox

import (
	"errors"

	"github.com/sendonce/sendonce/outbox"
)

// The errors a caller of this package branches on, matched with errors.Is:
// a row that is not there (the console's 404, relay trace's "no such
// message"), and the connection strings refused before any connection
// (service start-up names DATABASE_URL with them).

// ErrNotFound is returned for an id that has no row; it is the public
// package's, so that callers match one error whichever package read the row.
var ErrNotFound = outbox.ErrNotFound

// ErrUnparsableDSN is a connection string that does not parse. It never
// holds the string: "password = s3cret" (spaces around "=") or a URL
// password with an unescaped "@" would reach the message whole.
var ErrUnparsableDSN = errors.New("cannot parse the connection string (left out: it may hold a password)")

// ErrSessionSetting is a connection string that sets plan_cache_mode, a
// session setting, for a transaction pooler, which keeps none.
var ErrSessionSetting = errors.New("the connection string sets plan_cache_mode, a session setting, which a transaction pooler does not keep: leave it out (every statement is planned for its parameters there)")
