package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/sendonce/sendonce/outbox"
)

// An application records the SMS in the same transaction as its business
// change; the relay and the senders do the rest.
func ExampleEnqueue() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()

	var id uuid.UUID // the message's idempotency key, for Status later
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... the business change, such as INSERT INTO login_challenges ...
		var err error
		id, err = outbox.Enqueue(ctx, tx, "+15551234567", "Your code is 482901")
		return err
	})
	fmt.Println("commit:", err)

	st, err := outbox.Status(ctx, pool, id)
	fmt.Println("status:", st.Status, err)
	// Output:
	// commit: <nil>
	// status: pending <nil>
}

// With database/sql, EnqueueSQL takes the *sql.Tx; any Postgres driver
// works.
func ExampleEnqueueSQL() {
	ctx := context.Background()
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer tx.Rollback()
	id, err := outbox.EnqueueSQL(ctx, tx, "+15551234567", "Your code is 482901")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("commit:", tx.Commit())

	st, err := outbox.StatusSQL(ctx, db, id)
	fmt.Println("status:", st.Status, err)
	// Output:
	// commit: <nil>
	// status: pending <nil>
}

// A bulk send writes every message in one statement.
func ExampleEnqueueBatch() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()

	msgs := []outbox.Message{
		{To: "+15551234567", Body: "Your parcel is on its way"},
		{To: "+442071234567", Body: "Your parcel is on its way"},
		{To: "+33612345678", Body: "Votre colis est en route"},
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		ids, err := outbox.EnqueueBatch(ctx, tx, msgs)
		fmt.Println("ids:", len(ids))
		return err
	})
	fmt.Println("commit:", err)
	// Output:
	// ids: 3
	// commit: <nil>
}

// Invalid input is refused before any SQL, with an error that names the
// field and never repeats its value.
func ExampleValidate() {
	err := outbox.Validate("555-1234", "hi")
	fmt.Println(err)

	var ve *outbox.ValidationError
	if errors.As(err, &ve) {
		fmt.Println("field:", ve.Field)
	}
	fmt.Println("invalid:", errors.Is(err, outbox.ErrInvalid))

	fmt.Println(outbox.Validate("+15551234567", ""))
	// Output:
	// outbox: invalid to: not an E.164 number (+ then 2 to 15 digits, no leading 0)
	// field: to
	// invalid: true
	// outbox: invalid body: empty
}

// A sign-up form posted twice sends one code: the second write of the same
// key finds the first message. The code is worth sending for ten minutes.
func ExampleWithKey() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()

	key := "signup:" + uuid.NewString() // the form's submission id
	expires := time.Now().Add(10 * time.Minute)
	var ids []uuid.UUID
	for range 2 { // the form, posted twice
		var created bool
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			id, err := outbox.Enqueue(ctx, tx, "+15551234567", "Your code is 482901",
				outbox.WithKey(key), outbox.WithExpiresAt(expires), outbox.Created(&created))
			ids = append(ids, id)
			return err
		})
		fmt.Println("written:", created, err)
	}
	fmt.Println("one message:", ids[0] == ids[1])

	// The same key for another message is refused, and nothing is written.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ctx, tx, "+15551234567", "Your code is 000000", outbox.WithKey(key))
		return err
	})
	fmt.Println("another message:", errors.Is(err, outbox.ErrKeyReused))
	// Output:
	// written: true <nil>
	// written: false <nil>
	// one message: true
	// another message: true
}

// A reminder for tomorrow waits as scheduled, and is taken back when the
// booking is cancelled.
func ExampleCancel() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()

	var id uuid.UUID
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		id, err = outbox.Enqueue(ctx, tx, "+15551234567", "Your table is booked for 8pm tomorrow",
			outbox.WithSendAt(time.Now().Add(24*time.Hour)))
		return err
	})
	st, _ := outbox.Status(ctx, pool, id)
	fmt.Println("status:", st.Status, err)

	state, err := outbox.Cancel(ctx, pool, id)
	fmt.Println("after cancel:", state, err)
	// Output:
	// status: scheduled <nil>
	// after cancel: cancelled <nil>
}

// A caller tells the errors it can act on apart with errors.Is: a
// database relay migrate has not reached, a key that names another
// message, invalid input. (Here the connection looks in a schema that
// holds no sms_outbox, as a database never migrated does.)
func ExampleErrNotMigrated() {
	ctx := context.Background()
	u, err := url.Parse(os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	q := u.Query()
	q.Set("search_path", "a_schema_never_migrated")
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ctx, tx, "+15551234567", "Your code is 482901")
		return err
	})
	switch {
	case errors.Is(err, outbox.ErrNotMigrated):
		fmt.Println("not migrated: run relay migrate first, then try again")
	case errors.Is(err, outbox.ErrKeyReused):
		fmt.Println("this key names another message")
	case errors.Is(err, outbox.ErrInvalid):
		fmt.Println("fix the input:", err)
	case err != nil:
		fmt.Println("try again later:", err)
	}
	// Output:
	// not migrated: run relay migrate first, then try again
}
