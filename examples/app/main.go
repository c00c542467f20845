// Command app is the smallest application that uses sendonce: it records
// one SMS in a transaction of its own, the way a service records a login
// code, and prints the message's id, its status, and the command that
// follows it through the pipeline (relay trace).
//
//	DATABASE_URL=postgres://... go run . [-to +15551234567] [-body "Your code is 482901"]
//
// It is its own module, as an application would be; its go.mod points
// github.com/sendonce/sendonce at this repository with a replace directive.
// Once DATABASE_URL names a database migrated by "relay migrate", a running
// relay and sender deliver the message.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sendonce/sendonce/outbox"
)

func main() {
	to := flag.String("to", "+15551234567", "E.164 number to send to")
	body := flag.String("body", "Your code is 482901", "message text")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Getenv("DATABASE_URL"), *to, *body); err != nil {
		fmt.Fprintln(os.Stderr, "app:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, databaseURL, to, body string) error {
	if databaseURL == "" {
		return fmt.Errorf("DATABASE_URL is required")
	}
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()

	var id uuid.UUID
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// The business change would go here, in the same transaction.
		var err error
		id, err = outbox.Enqueue(ctx, tx, to, body)
		return err
	})
	if err != nil {
		return fmt.Errorf("enqueue: %w", err)
	}
	st, err := outbox.Status(ctx, pool, id)
	if err != nil {
		return err
	}
	fmt.Printf("enqueued %s: %s\n", id, st.Status)
	// The relay and the senders take it from here; this shows each step.
	fmt.Printf("follow it: relay trace %s\n", id)
	return nil
}
