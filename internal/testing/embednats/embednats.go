// Package embednats runs a NATS server with JetStream inside the process: for
// tests, which need to stop, restart and cut off the broker, and for the demo
// when NATS_URL is unset.
package embednats

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Config says how to run the server.
type Config struct {
	// Host to listen on; default 127.0.0.1.
	Host string
	// Port to listen on; 0 or -1 picks a free port.
	Port int
	// StoreDir is the JetStream file store; required, so that a restart on
	// the same directory keeps the streams and their dedup state.
	StoreDir string
	// Options, when set, is applied to the server options last (auth, TLS).
	Options func(*server.Options)
}

// Start starts a server and waits until it accepts clients.
func Start(cfg Config) (*server.Server, error) {
	if cfg.StoreDir == "" {
		return nil, errors.New("embednats: StoreDir is required")
	}
	port := cfg.Port
	if port == 0 {
		port = -1
	}
	opts := &server.Options{
		Host:               cmpOr(cfg.Host, "127.0.0.1"),
		Port:               port,
		JetStream:          true,
		StoreDir:           cfg.StoreDir,
		NoLog:              true,
		NoSigs:             true,
		MaxPayload:         1 << 20,
		JetStreamMaxMemory: 256 << 20,
		// A cap, not an allocation: room for the reservation of SMS's
		// max_bytes (16 GiB, nats/SMS.stream.json) and SMS_DLQ's (4 GiB).
		JetStreamMaxStore: 64 << 30,
	}
	if cfg.Options != nil {
		cfg.Options(opts)
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embednats: new server: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, errors.New("embednats: server not ready within 10s")
	}
	return s, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
