package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/sendonce/sendonce/internal/testing/embednats"
)

// natsAnnounce starts the line the NATS child prints once it accepts clients.
const natsAnnounce = "nats listening on "

// runNATSServer is the child mode "bench nats-server -store DIR": an
// embedded NATS server with JetStream on a free loopback port, in a process
// of its own so that its CPU time and memory are measured apart. It prints
// one line with its URL and serves until ctx ends (SIGTERM) or the bench
// dies (the parent sets a death signal).
func runNATSServer(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench nats-server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	store := fs.String("store", "", "JetStream store directory (required)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	srv, err := embednats.Start(embednats.Config{StoreDir: *store})
	if err != nil {
		fmt.Fprintf(stderr, "bench nats-server: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "%s%s\n", natsAnnounce, srv.ClientURL())
	<-ctx.Done()
	srv.Shutdown()
	srv.WaitForShutdown()
	return 0
}
