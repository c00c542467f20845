package migrate

import "errors"

// The errors a caller of this package branches on (relay migrate, the
// workers' start-up), matched with errors.Is.

// ErrSchemaTooOld is returned by CheckVersion when the database's schema is
// older than the binary needs.
var ErrSchemaTooOld = errors.New("database schema is older than this binary needs")

// ErrNotEmpty is returned by Down when sms_outbox holds rows and
// Config.Force is not set.
var ErrNotEmpty = errors.New("sms_outbox holds rows")

// ErrSchemaOpen is returned by Up when roles other than the owner of the
// schema the migrations create their objects in may create objects there.
var ErrSchemaOpen = errors.New("roles other than the schema's owner may create objects in it")
