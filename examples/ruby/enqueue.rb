# Enqueue SMS with sendonce from Ruby (pg), in the application's own
# transaction, and read the status back.
#
#   DATABASE_URL=postgres://... ruby enqueue.rb [+15551234567] [intent-key]
#
# It writes a one-time code as an urgent message (priority 1), and an order
# notice once per key through sendonce_enqueue: run it twice with the same
# key and the second run writes nothing and gets the first message's id.
# Debian: apt-get install ruby-pg.
require 'pg'
require 'securerandom'

to = ARGV[0] || '+15551234567'
key = ARGV[1] || 'order:42:shipped'
conn = PG.connect(ENV.fetch('DATABASE_URL'))
begin
  # A fresh id per message: its idempotency key at the provider for its
  # whole life (a version 7 UUID sorts by time and is best; a random one
  # works).
  code_id = SecureRandom.uuid
  notice = nil
  conn.transaction do |tx|
    # ... the business change goes here, in the same transaction ...
    tx.exec_params('INSERT INTO sms_outbox (id, to_e164, body, priority) VALUES ($1, $2, $3, 1)',
                   [code_id, to, 'Your code is 482901'])
    notice = tx.exec_params('SELECT id, created FROM sendonce_enqueue($1, $2, $3, $4)',
                            [SecureRandom.uuid, to, 'Your order 42 has shipped', key]).first
  end
  # Committed: the relay and the senders take it from here.
  status = conn.exec_params('SELECT status FROM sendonce_status($1)', [code_id]).getvalue(0, 0)
  puts "enqueued #{code_id}: #{status}"
  puts "keyed #{notice['id']}: created #{notice['created'] == 't'}"
  puts "follow it: relay trace #{code_id}"
ensure
  conn.close
end
