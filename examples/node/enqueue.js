// Enqueue SMS with sendonce from Node (pg), in the application's own
// transaction, and read the status back.
//
//   DATABASE_URL=postgres://... node enqueue.js [+15551234567] [intent-key]
//
// It writes a one-time code as an urgent message (priority 1), and an
// order notice once per key through sendonce_enqueue: run it twice with the
// same key and the second run writes nothing and gets the first message's
// id. npm install (package.json: pg).
'use strict';

const crypto = require('node:crypto');
const { Client } = require('pg');

async function main() {
  const to = process.argv[2] || '+15551234567';
  const key = process.argv[3] || 'order:42:shipped';
  const client = new Client({ connectionString: process.env.DATABASE_URL });
  await client.connect();
  try {
    // A fresh id per message: its idempotency key at the provider for its
    // whole life (a version 7 UUID sorts by time and is best; a random one
    // works).
    const codeId = crypto.randomUUID();
    let notice;
    await client.query('BEGIN');
    try {
      // ... the business change goes here, in the same transaction ...
      await client.query('INSERT INTO sms_outbox (id, to_e164, body, priority) VALUES ($1, $2, $3, 1)',
        [codeId, to, 'Your code is 482901']);
      const r = await client.query('SELECT id, created FROM sendonce_enqueue($1, $2, $3, $4)',
        [crypto.randomUUID(), to, 'Your order 42 has shipped', key]);
      notice = r.rows[0];
      await client.query('COMMIT');
    } catch (err) {
      await client.query('ROLLBACK');
      throw err;
    }
    // Committed: the relay and the senders take it from here.
    const st = await client.query('SELECT status FROM sendonce_status($1)', [codeId]);
    console.log(`enqueued ${codeId}: ${st.rows[0].status}`);
    console.log(`keyed ${notice.id}: created ${notice.created}`);
    console.log(`follow it: relay trace ${codeId}`);
  } finally {
    await client.end();
  }
}

main().catch((err) => {
  console.error('enqueue:', err.message);
  process.exit(1);
});
