// Package natsconn connects the sendonce processes to NATS with the
// reconnect behaviour a long-running worker needs.
package natsconn

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Config says how to connect.
type Config struct {
	// URL is the server URL (or a comma-separated list).
	URL string
	// Name identifies the client in the server's monitoring.
	Name string
	// PublishWindow bounds the asynchronous publications awaiting a PubAck.
	PublishWindow int
	// ConnectTimeout bounds the first connection.
	ConnectTimeout time.Duration
	// Logger receives connection events.
	Logger *slog.Logger
}

// Connect connects and returns the connection and its JetStream context. The
// connection reconnects forever: a broker outage pauses the work, it does not
// end the process.
func Connect(cfg Config) (*nats.Conn, jetstream.JetStream, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	opts := []nats.Option{
		nats.Name(cfg.Name),
		nats.Timeout(cfg.ConnectTimeout),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(500 * time.Millisecond),
		nats.ReconnectJitter(250*time.Millisecond, time.Second),
		nats.ReconnectBufSize(32 << 20),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil: a deliberate close
				log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("nats reconnected", "server", nc.ConnectedServerId())
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			log.Warn("nats async error", "err", err)
		}),
	}
	nc, err := nats.Connect(cfg.URL, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to NATS_URL: %w", err)
	}
	jsOpts := []jetstream.JetStreamOpt{}
	if cfg.PublishWindow > 0 {
		// The relay keeps its own window per batch; this is the library's
		// bound, set above it so it never stalls first.
		jsOpts = append(jsOpts, jetstream.WithPublishAsyncMaxPending(2*cfg.PublishWindow))
	}
	js, err := jetstream.New(nc, jsOpts...)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	return nc, js, nil
}

// Drain drains nc (pending publications and acks are flushed, subscriptions
// closed) and waits up to timeout for it to close.
func Drain(nc *nats.Conn, timeout time.Duration) error {
	if err := nc.Drain(); err != nil {
		return fmt.Errorf("drain nats connection: %w", err)
	}
	deadline := time.Now().Add(timeout)
	for !nc.IsClosed() {
		if time.Now().After(deadline) {
			nc.Close()
			return fmt.Errorf("nats drain did not finish within %s", timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}
