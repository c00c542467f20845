package outbox

import (
	"errors"
	"fmt"
)

// The errors a caller of this package can tell apart, with errors.Is or
// errors.As. Any other error is the database's or the context's, wrapped
// with what the call was doing.
//
//	ErrInvalid        the message was refused before anything was written (*ValidationError names the field)
//	ErrKeyReused      the idempotency key names another message; nothing was written
//	ErrNotFound       Status of an id that has no row
//	ErrNotMigrated    the database lacks what this release needs: run relay migrate

// ErrInvalid is matched by errors.Is for every *ValidationError.
var ErrInvalid = errors.New("outbox: invalid message")

// ValidationError names the field of a message that was refused. Its text
// never contains the field's value: phone numbers and bodies stay out of
// logs.
type ValidationError struct {
	// Field is "to" or "body".
	Field string
	// Reason says what is wrong, without the value.
	Reason string
}

// Error returns "outbox: invalid <field>: <reason>".
func (e *ValidationError) Error() string { return "outbox: invalid " + e.Field + ": " + e.Reason }

// Is makes errors.Is(err, ErrInvalid) true.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalid }

// ErrKeyReused is matched by errors.Is when a key given to WithKey (or the
// idempotency_key column) already names a message with another number or
// body. Nothing was written.
var ErrKeyReused = errors.New("outbox: idempotency key already used for another message")

// ErrNotFound is returned by Status and StatusSQL for an id that has no
// row: it was never committed, or it finished long enough ago to be purged.
var ErrNotFound = errors.New("outbox: no such message")

// ErrNotMigrated is matched (errors.Is) by the error of a call on a
// database that has no sms_outbox, or not the functions the call needs: a
// database never migrated, or migrated by an older release. Run `relay
// migrate` of this release first; nothing was written.
var ErrNotMigrated = errors.New("outbox: the database is not migrated for this release: run relay migrate first")

// dbError wraps err, from the statement that did what, with ErrNotMigrated
// when Postgres says a table or a function is missing (undefined_table
// 42P01, undefined_function 42883, from any driver that reports the
// SQLSTATE).
func dbError(what string, err error) error {
	var st interface{ SQLState() string }
	if errors.As(err, &st) && (st.SQLState() == "42P01" || st.SQLState() == "42883") {
		return fmt.Errorf("outbox: %s: %w (%w)", what, ErrNotMigrated, err)
	}
	return fmt.Errorf("outbox: %s: %w", what, err)
}
