// Package sendonce holds the files that the programs embed: the database
// migrations and the JetStream stream and consumer definitions. The code lives
// under internal/ and cmd/.
package sendonce

import "embed"

// Migrations holds migrations/NNNN_name.up.sql and .down.sql, applied in order
// of their number by `relay migrate`.
//
//go:embed migrations/*.sql
var Migrations embed.FS

// NATSConfig holds nats/*.json: stream configs (stream_*.json) and consumer
// configs (consumer_*.json) in the shape `nats stream add --config` and
// `nats consumer add --config` accept.
//
//go:embed nats/*.json
var NATSConfig embed.FS
