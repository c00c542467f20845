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

# One intent: the application's own key

A form posted twice, a client that retries after a timeout, a job that ran
twice: each writes the same intent again. WithKey names it with a key of
the application's own (1 to MaxKeyChars characters, no control
characters), and at most one message is ever written for a key, by the
database itself, under any concurrency:

	var created bool
	id, err := outbox.Enqueue(ctx, tx, "+15551234567", "Your code is 482901",
		outbox.WithKey("login:"+userID+":"+challengeID), outbox.Created(&created))

The same key with the same number and body writes nothing and returns the
first message's id (created is false); with another number or body the
call fails with an error matching ErrKeyReused, writes nothing, and
aborts the transaction, as any SQL error does. EnqueueBatch takes a Key per
Message (CreatedEach reports which were new; two messages of one batch
with the same key are one message). A key lives as long as its message's
row: once retention has purged a finished message, its key may be used
again.

# On time: a send time and an expiry

WithSendAt holds a message until a time: it is StatusScheduled until
then, no provider call is made before it, and the relay makes it pending
when it comes (within about a quarter of a second). WithExpiresAt gives it
an expiry: no provider call is started at or after it, and a message that
reaches it unsent ends StatusExpired, never sent, however long an outage
held it back. The provider is told the time left too (Twilio's
ValidityPeriod, Sinch's expire_at, the generic API's expires_at), so that
it does not deliver the message late either. A message a call may already
have reached is not expired: the provider's answer, a lookup or a
receipt settles it, as for any message.

	id, err := outbox.Enqueue(ctx, tx, "+15551234567", "Your code is 482901",
		outbox.WithExpiresAt(time.Now().Add(10*time.Minute)))

	id, err := outbox.Enqueue(ctx, tx, "+15551234567", "Your table is booked for 8pm",
		outbox.WithSendAt(tomorrow9am))

# Cancel

Cancel takes a message back while no provider call has started for it: it
ends StatusCancelled and is never sent. Later it changes nothing and says
what the message is (StatusSending, StatusSent, ...). A cancel and a
sender's claim of the same message are ordered by the database: the
message is either cancelled and never called, or called and not
cancelled.

	st, err := outbox.Cancel(ctx, pool, id)

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
	scheduled    written with a send time still to come (WithSendAt)
	expired      its expiry came before any call could take it: never sent
	cancelled    taken back by Cancel before any call: never sent
	suppressed   its number is on the suppression list: never sent

and moves forward only:

	scheduled -> pending -> queued -> sending -> sent -> delivered | undelivered
	                                         \-> dead | unknown
	scheduled, pending, queued -> expired | cancelled
	pending, queued -> suppressed

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

	INSERT INTO sms_outbox (id, to_e164, body) VALUES ($1, $2, $3);  -- $1: a UUID, version 7 best (it sorts by time)
	SELECT status, provider_ref, last_error FROM sendonce_status($1);

with, if it wants them, the columns priority, idempotency_key, send_at,
expires_at and traceparent (its tracing SDK's W3C Trace Context of the
current span) in the same INSERT. A plain INSERT ... ON CONFLICT DO NOTHING
with a key already used writes nothing; sendonce_enqueue writes the
message or returns the one its key names (and refuses another number or
body with unique_violation), in one statement:

	SELECT id, created FROM sendonce_enqueue($1, $2, $3, $4);  -- id, number, body, key
	SELECT id, created FROM sendonce_enqueue($1, $2, $3, $4, 2::smallint, NULL, now() + interval '10 minutes');
	SELECT id, created FROM sendonce_enqueue($1, $2, $3, $4, 2::smallint, NULL, NULL, $5);  -- $5: traceparent
	SELECT sendonce_cancel($1);  -- the status after it; NULL: no such message
*/
package outbox
