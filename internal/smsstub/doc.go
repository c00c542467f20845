// Package smsstub is a stand-in for an SMS provider's HTTP API, used by the
// demo, the integration tests and the benchmarks. It implements the contract
// a real provider must honour for sendonce to deliver each message once, and
// it can be told to misbehave (fail, rate-limit, stall, or accept a message
// and then drop the response) so that the sender's retry path is exercised.
//
// # Messages API
//
//	POST /v1/messages
//	Content-Type: application/json
//	Idempotency-Key: <key>
//	Authorization: Bearer <api key>
//
//	{"to":"+15551234567","body":"Your code is 482901"}
//
// The body may also carry "reference", "callback_url" (receipts) and
// "expires_at", the message's expiry as an RFC 3339 date-time
// ("2030-01-02T03:04:05.678Z"); the stub records the expiry of each
// delivery (Delivery.ExpiresAt, in /admin/deliveries) so that tests can
// see it arrived, and when each delivery's request arrived (Server.Taken,
// /admin/taken) so that they can see no message was sent before its time.
//
// A new message is answered 201 with
//
//	{"id":"msg_<24 hex digits>","to":"+15551234567","status":"queued"}
//
// and errors are answered with a 4xx/5xx status and a body of the form
// {"code":21211,"message":"invalid To number"}, where code may be absent.
// The checks run in this order:
//
//   - 401 code 20003 when Config.APIKey is set and the request does not carry
//     "Authorization: Bearer <APIKey>".
//   - 400 code 400 when Idempotency-Key is missing or empty (unless
//     Config.IgnoreKeys), or longer than MaxKeyLen bytes.
//   - 415 code 415 when Content-Type is not application/json.
//   - 413 code 413 when the request body exceeds MaxRequestBytes.
//   - 400 code 400 when the body is not a single JSON object; 400 code
//     CodeInvalidTo (21211) when "to" does not match ^\+[1-9][0-9]{1,14}$;
//     400 code CodeBodyRequired (21602) when "body" is empty; 400 code
//     CodeBodyTooLong (21617) when "body" is longer than MaxBodyChars
//     characters; 400 code 400 when "expires_at" is present and not an
//     RFC 3339 date-time.
//
// A well-formed request then goes through the idempotency cache. The cache
// compares the SHA-256 of the raw request body bytes, so a retry must resend
// exactly the same bytes, not merely equivalent JSON:
//
//   - key seen, response stored, same body: the stored status and body are
//     replayed byte for byte with the header "Idempotent-Replayed: true", and
//     no new delivery is made;
//   - key seen, different body: 422 code 422;
//   - key seen, first request still being processed: 409 code 409;
//   - key unseen (or keys ignored), or its stored response older than
//     Config.Retention, and "expires_at" at or before the stub's clock (Config.Now) when the
//     request arrives: 400 code CodeExpired (30036, Twilio's "Validity
//     Period Expired") with the message "message expired before it was
//     taken: ...", counted in Stats.Expired; nothing is delivered and the
//     key stays unseen, as at a provider that drops expired messages. A
//     key already taken gets its replay, expired or not: the refusal
//     would say nothing was sent;
//   - key unseen, or its stored response older than Config.Retention: the
//     request is processed, which waits Latency plus jitter and then applies
//     the faults in order: rate limit (429 code CodeRateLimited with a
//     Retry-After header in whole seconds), injected failure (FailStatus,
//     code FailCode when non-zero), else success. Only successes are stored;
//     a 429 or an injected failure leaves the key unseen, so a retry is
//     processed afresh.
//
// When the response is withheld (Faults.WithholdRate), the delivery has
// already been counted and the response stored, so a retry with the same key
// gets the replay. With WithholdClose the connection is closed without a
// response; note that Go's http.Transport transparently re-sends a request
// that carries an Idempotency-Key header (and has a rewindable body) when a
// reused keep-alive connection is closed before any response byte arrives,
// so a Go client only sees the error when the request went out on a fresh
// connection.
//
// # Twilio facade
//
// With Config.Twilio.AccountSID set, the stub also serves Twilio's
// Messages resource, so that the sender's real Twilio adapter, its lookup
// and the receiver's Twilio callbacks can be run against it:
//
//	POST /2010-04-01/Accounts/{AccountSid}/Messages.json
//	Authorization: Basic <AccountSid:AuthToken>
//	Content-Type: application/x-www-form-urlencoded
//
//	To=%2B15551234567&From=%2B15550001111&Body=...&StatusCallback=https://.../v1/receipts/twilio?ref=<outbox id>
//
// MessagingServiceSid may stand for From, and ValidityPeriod may give the
// seconds the message may wait in the queue; each delivery's record keeps
// it (Delivery.ValidityPeriod, "validity_period" in /admin/deliveries),
// so tests can see it arrived. A message is answered 201 with
// Twilio's Message resource (sid "SM" and 32 hex digits, status queued, or
// accepted through a messaging service, date_sent null), and errors with
// Twilio's {"code","message","more_info","status"}: 401 code 20003 for
// other credentials, 404 code 20404 for another account, 400 code 21211
// (the number echoed, as Twilio does), 21603, 21602, 21617 or 21609 for a
// bad To, no sender, an empty or oversize body, a bad StatusCallback; 400
// code 20001 for a ValidityPeriod that is not an integer from 1 to 36000,
// the bounds Twilio's OpenAPI document gives it (Twilio itself answers a
// period below its minimum with 30012, "TTL is too small"). The facade
// does not expire a queued message when its period runs out.
// Nothing is idempotent: every request that gets past the faults (the same
// Faults as the generic API: latency, 429, injected failures, drops,
// withheld answers) is a new message. Deliveries are counted per key: the
// ref parameter of StatusCallback (the outbox id the adapter puts there),
// or without one "body:" and a hash of To and Body; so a double send shows
// as two deliveries of one key.
//
// A message stays queued without date_sent for Twilio.QueueFor, is then
// sent (date_sent set; through a messaging service its From becomes
// TwilioPoolNumber), and its fate is known Receipts.Delay later. Its
// StatusCallback gets a form signed with X-Twilio-Signature (the auth
// token's HMAC-SHA1 of the URL and the sorted fields) when it is sent and
// when its fate is known, with Receipts' duplicates and reordering.
//
//	GET /2010-04-01/Accounts/{AccountSid}/Messages.json?To=...&From=...&DateSent>=YYYY-MM-DD&PageSize=50
//
// lists the account's messages, filtered by To, From and DateSent (=, <=,
// >=; a message not sent yet passes none of them), newest first as Twilio
// documents it, by date_sent, with the messages not sent yet after all the
// others (Twilio does not say where they go). A page holds PageSize
// messages (default 50, at most 1000); next_page_uri leads to the next, null
// on the last. Faults.LookupFailRate fails a list with 500.
//
// # Opt-outs and inbound messages
//
// A number the stub is told a recipient opted out of (OptOut) gets 400
// code CodeOptedOut (21610, Twilio's "Attempt to send to unsubscribed
// recipient") at both APIs, nothing delivered (a key already taken still
// gets its replay), until OptIn. SendInbound forwards a recipient's reply
// to the receiver's inbound endpoint, signed as each API signs them: the
// generic JSON {"id","from","to","text"} with Sendonce-Signature under
// Receipts.Secret, or Twilio's incoming-message form with
// X-Twilio-Signature under the auth token. An opt-out keyword sent in
// Twilio's shape also opts the number out, and an opt-in lifts it, as
// Twilio's own keyword handling does.
//
// # Admin API
//
// The admin endpoints are unauthenticated; bind the stub to loopback.
//
//	GET  /admin/deliveries  {"<key>":{"to":"+1555…","deliveries":1,"requests":2,"provider_id":"msg_…","expires_at":"…"}}
//	GET  /admin/taken       {"<key>":"2030-01-02T03:04:05.678901234Z"}: when the request of the key's last delivery arrived
//	GET  /admin/stats       {"requests":N,"deliveries":N,"replays":N,"conflicts":N,"mismatches":N,"failures":N,"rate_limited":N,"withheld":N,"expired":N,"opted_out":N,"keys":N}
//	POST /admin/reset       clears deliveries, stored responses, opt-outs and counters (204); faults are kept
//	GET  /admin/faults      the faults in force, as a Faults JSON object
//	POST /admin/faults      replaces the faults with the posted Faults JSON object and returns the result
//	POST /admin/inbound     {"url","shape","from","to","text"}: SendInbound it; answers {"status":<the receiver's>}
//	GET  /healthz           200 "ok"
//
// The generic API never stores or exposes a message body (only hashes of
// requests are kept); the Twilio facade keeps them in memory, as its list
// answers them.
package smsstub
