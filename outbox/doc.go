/*
Package outbox is how an application asks sendonce to send an SMS: it
records the message in the application's own database transaction, and
reads back how far the message got.

# The idea

The message is a row in the table sms_outbox, written in the same
transaction as the business change it belongs to (a login challenge, an
order, a password reset). If the transaction commits, the message will be
sent, exactly once as the user sees it; if it rolls back, nothing was ever
asked. The relay and the sender processes do the rest: nothing in the
application calls the provider, retries, or waits.

The row's id, minted here when the intent is written, is the message's
idempotency key for its whole life: every attempt, retry and redelivery
carries it to the provider, which is what makes a lost response harmless.

# Enqueueing with pgx

Enqueue takes the application's pgx.Tx:

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... the business change ...
		id, err := outbox.Enqueue(ctx, tx, "+15551234567", "Your code is 482901")
		if err != nil {
			return err
		}
		// keep id if the application wants to show the message's status later
		_ = id
		return nil
	})

EnqueueBatch writes many messages in one statement and one round trip, for
a bulk send:

	ids, err := outbox.EnqueueBatch(ctx, tx, []outbox.Message{
		{To: "+15551234567", Body: "Your parcel is on its way"},
		{To: "+442071234567", Body: "Your parcel is on its way"},
	})

# Priorities

A message is Normal unless the application says otherwise. A one-time code a
user is waiting for goes ahead of a campaign of 200,000 bulk messages:

	id, err := outbox.Enqueue(ctx, tx, "+15551234567", "Your code is 482901",
		outbox.WithPriority(outbox.Urgent))

	ids, err := outbox.EnqueueBatch(ctx, tx, []outbox.Message{
		{To: "+15551234567", Body: "Spring sale", Priority: outbox.Bulk},
	})

The relay publishes urgent rows first, and each sender takes urgent messages
before normal ones and normal before bulk, while giving every lower lane a
minimum share of its work, so bulk is delayed by urgent traffic, never
starved. The priority is part of the message: it cannot change after the
insert. Other languages set the column priority (1, 2 or 3) in the INSERT.

# Enqueueing with database/sql

EnqueueSQL takes a *sql.Tx from any Postgres driver (pgx's stdlib, lib/pq):

	tx, err := db.BeginTx(ctx, nil)
	...
	id, err := outbox.EnqueueSQL(ctx, tx, "+15551234567", "Your code is 482901")
	...
	err = tx.Commit()

# Validation

Every Enqueue function checks its input first, the way the table's
constraints will, and sends no SQL when a message is refused:

  - to is an E.164 number: "+", then 2 to 15 digits, the first not 0;
  - body is 1 to MaxBodyChars characters of valid UTF-8, without NUL.

A refusal is a *ValidationError naming the field ("to" or "body") and what
is wrong with it; errors.Is(err, ErrInvalid) matches every one. Its text
never contains the value: a phone number or a message body never reaches
a log through an error of this package. Validate runs the same checks on
their own, for a form that wants to answer before it writes anything.

The database refuses the same rows again (CHECK constraints), and refuses
any later change of a row's id, number or body: a message with other
content is a new row with a new id.

# Statuses

Status reads a message back (StatusSQL for database/sql). Its State is one
of

	pending      written by the application, not yet handed to the broker
	queued       in the broker, waiting for a sender (or for a retry)
	sending      a sender is calling the provider
	sent         the provider accepted it
	delivered    the provider reported it delivered to the phone
	undelivered  the provider reported it could not be delivered
	dead         it will not be sent, and the user got nothing
	unknown      an attempt may or may not have reached the provider;
	             a person decides (see the operator commands)

and moves forward only:

	pending -> queued -> sending -> sent -> delivered | undelivered
	                            \-> dead | unknown

A retry takes a row from sending back to queued, which ends one attempt
rather than going back. delivered and undelivered come from the provider's
delivery receipts; until receipts are enabled a message ends at sent.
delivered and undelivered are final; sent and unknown may still be settled
by a receipt. dead is final too, save in one case: a signed receipt from the
provider saying it had the message after all (sendonce concluded it never
did). The provider's word wins, and the message becomes sent, delivered or
undelivered as the receipt says. State.Terminal reports whether the pipeline
is done with a message.

# What the application needs

The table and the rest of the schema come from "relay migrate". An
application role needs only INSERT on (id, to_e164, body) and EXECUTE on
the function sendonce_status, which returns the status columns of the one
row whose id it is given; the migrations create such a role, sendonce_app.
It cannot read the table itself: not another row's status, number or body.

An application in another language writes the same row itself:

	INSERT INTO sms_outbox (id, to_e164, body) VALUES ($1, $2, $3);  -- $1: a random UUID
	SELECT status, provider_ref, last_error FROM sendonce_status($1);
*/
package outbox
