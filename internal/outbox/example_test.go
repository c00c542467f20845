package outbox_test

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"

	"github.com/sendonce/sendonce/internal/outbox"
)

// An application records the SMS in the same transaction as its business
// change; the relay and the senders do the rest. Invalid input is refused
// before any SQL, with an error that names the field.
func ExampleEnqueue() {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, exampleDatabaseURL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close(ctx)

	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		// ... the business change, e.g. INSERT INTO login_challenges ...
		id, err := outbox.Enqueue(ctx, tx, "+15551234567", "Your code is 482901")
		if err != nil {
			return err
		}
		st, err := outbox.Status(ctx, tx, id)
		if err != nil {
			return err
		}
		fmt.Println("status:", st.Status)
		return nil
	})
	fmt.Println("commit:", err)

	_, err = outbox.Enqueue(ctx, nil, "555-1234", "hi")
	fmt.Println(err)
	// Output:
	// status: pending
	// commit: <nil>
	// outbox: invalid to: not an E.164 number (+ then 2 to 15 digits, no leading 0)
}

var exampleDatabaseURL = os.Getenv("SENDONCE_EXAMPLE_DATABASE_URL")
