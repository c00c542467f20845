package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/natsconn"
	"github.com/sendonce/sendonce/internal/service"
	"github.com/sendonce/sendonce/internal/streams"
)

// setupConfig is what relay setup needs: NATS, the replicas and the logs.
type setupConfig struct {
	service.Settings
}

func bindSetup(s *envflag.Set, c *setupConfig) {
	s.Intro("relay setup creates or updates the JetStream topology (the streams SMS and SMS_DLQ, the senders' consumers and their flow bucket) with NATS_REPLICAS copies, then exits. " +
		"Run it with credentials allowed to manage streams (an administrator), before relays and senders that run with NATS_ENSURE_TOPOLOGY=false and least-privilege users; run it again after an upgrade that changes nats/.")
	natsconn.Bind(s, &c.NATS)
	streams.BindReplicas(s, &c.Topology.Replicas)
	s.Enum(&c.LogFormat, "log-format", "LOG_FORMAT", "json", []string{"json", "text"}, "log format")
	s.Enum(&c.LogLevel, "log-level", "LOG_LEVEL", "info", []string{"debug", "info", "warn", "error"}, "log level")
}

// runSetup is "relay setup": it needs only NATS.
func runSetup(ctx context.Context, args []string, getenv func(string) string, _, stderr io.Writer) int {
	var c setupConfig
	s := envflag.New("relay setup", getenv, stderr)
	bindSetup(s, &c)
	root, code := service.Parse("relay setup", s, args, &c.Settings, stderr)
	if root == nil {
		return code
	}
	log := root.With("component", "relay")
	if err := setupTopology(ctx, c, log); err != nil {
		log.Error("setup failed", "err", err)
		return 1
	}
	return 0
}

// setupTopology connects (waiting up to service.StartTimeout for a broker
// that is still starting), ensures the topology and closes the connection.
func setupTopology(ctx context.Context, c setupConfig, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, 2*service.StartTimeout)
	defer cancel()
	nc, js, err := natsconn.Connect(service.NATSConfig(c.NATS, service.Options{Name: "sendonce-relay-setup"}, log))
	if err != nil {
		return err
	}
	defer nc.Close()
	if err := natsconn.WaitConnected(ctx, nc, log); err != nil {
		return err
	}
	// A request the user may not publish is not answered, which Setup
	// takes for a broker that is busy and retries until the deadline; the
	// server's permissions error arrives on the connection: stop at once,
	// saying so.
	ctx, refuse := context.WithCancelCause(ctx)
	defer refuse(nil)
	go func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if err := nc.LastError(); errors.Is(err, nats.ErrPermissionViolation) {
				refuse(fmt.Errorf("the NATS user may not manage the topology (relay setup needs admin credentials): %w", err))
				return
			}
		}
	}()
	if _, err := service.SetupTopology(ctx, js, c.Topology.Replicas, log); err != nil {
		if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, ctx.Err()) {
			return cause
		}
		return err
	}
	log.Info("nats topology ready", "replicas", c.Topology.Replicas)
	return nil
}
