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
//     characters.
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
// # Admin API
//
// The admin endpoints are unauthenticated; bind the stub to loopback.
//
//	GET  /admin/deliveries  {"<key>":{"to":"+1555…","deliveries":1,"requests":2,"provider_id":"msg_…"}}
//	GET  /admin/stats       {"requests":N,"deliveries":N,"replays":N,"conflicts":N,"mismatches":N,"failures":N,"rate_limited":N,"withheld":N,"keys":N}
//	POST /admin/reset       clears deliveries, stored responses and counters (204); faults are kept
//	GET  /admin/faults      the faults in force, as a Faults JSON object
//	POST /admin/faults      replaces the faults with the posted Faults JSON object and returns the result
//	GET  /healthz           200 "ok"
//
// Message bodies are never stored or exposed; only their hashes are kept.
package smsstub
