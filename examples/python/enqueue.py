"""Enqueue SMS with sendonce from Python (psycopg 3), in the application's
own transaction, and read the status back.

    DATABASE_URL=postgres://... python3 enqueue.py [+15551234567] [intent-key]

It writes a one-time code as an urgent message (priority 1), and an order
notice once per key through sendonce_enqueue: run it twice with the same
key and the second run writes nothing and gets the first message's id.
Debian: apt-get install python3-psycopg.
"""
import os
import sys
import uuid

import psycopg


def main():
    to = sys.argv[1] if len(sys.argv) > 1 else "+15551234567"
    key = sys.argv[2] if len(sys.argv) > 2 else "order:42:shipped"
    with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
        # A fresh id per message: its idempotency key at the provider for
        # its whole life (a version 7 UUID sorts by time and is best; a
        # random one works).
        code_id = uuid.uuid4()
        with conn.transaction():
            # ... the business change goes here, in the same transaction ...
            conn.execute(
                "INSERT INTO sms_outbox (id, to_e164, body, priority) VALUES (%s, %s, %s, 1)",
                (code_id, to, "Your code is 482901"),
            )
            notice_id, created = conn.execute(
                "SELECT id, created FROM sendonce_enqueue(%s, %s, %s, %s)",
                (uuid.uuid4(), to, "Your order 42 has shipped", key),
            ).fetchone()
        # Committed: the relay and the senders take it from here.
        (status,) = conn.execute("SELECT status FROM sendonce_status(%s)", (code_id,)).fetchone()
    print(f"enqueued {code_id}: {status}")
    print(f"keyed {notice_id}: created {str(created).lower()}")
    print(f"follow it: relay trace {code_id}")


if __name__ == "__main__":
    main()
