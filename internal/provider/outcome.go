// Package provider calls SMS providers over HTTP and classifies every result
// as a value: sent, retry (after a delay), permanent, ambiguous, or expired
// (not sent at all). It knows nothing of JetStream or SQL; the sender maps
// outcomes to acks and statuses.
package provider

import (
	"fmt"
	"time"
)

// Kind is the class of an attempt's outcome.
type Kind int

// The outcome classes (docs/design.md, failure classification).
const (
	// Sent: the provider accepted the message; Ref is its id.
	Sent Kind = iota + 1
	// Retry: the attempt failed in a way another attempt with the same key
	// may fix; After, when non-zero, is the provider's Retry-After.
	Retry
	// Permanent: retrying cannot help (bad request, bad number, bad
	// credentials); the message is dead.
	Permanent
	// Ambiguous: the request may have reached a provider that offers no
	// idempotency, so another attempt could send twice; never retried.
	Ambiguous
	// Expired: not sent, because the message's expiry (Message.ExpiresAt)
	// had passed when the request would have been built (HTTPStatus 0), or
	// when it reached a provider that refuses such a message (the generic
	// API's 4xx with code CodeExpired). The provider certainly does not
	// have the message from this attempt: MaybeAccepted is false. Another
	// attempt, at this provider or another, would be as late.
	Expired
)

func (k Kind) String() string {
	switch k {
	case Sent:
		return "sent"
	case Retry:
		return "retry"
	case Permanent:
		return "permanent"
	case Ambiguous:
		return "ambiguous"
	case Expired:
		return "expired"
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// CodeExpired is the error code with which the generic API refuses, with a
// 4xx, a message whose "expires_at" had passed when it arrived: it took
// nothing (docs/design.md, the provider HTTP API). Twilio uses the same
// number for a message that expired in its queue.
const CodeExpired = 30036

// Outcome is the classified result of one attempt. Its fields never hold a
// phone number, a body or a credential.
type Outcome struct {
	// Kind is the class.
	Kind Kind
	// Ref is the provider's message id (Sent).
	Ref string
	// After is the provider's Retry-After (Retry), zero when it gave none.
	After time.Duration
	// HTTPStatus is the response status, 0 when no response was read.
	HTTPStatus int
	// Code is the provider's error code, 0 when none.
	Code int
	// Reason is a short description fit for logs and last_error.
	Reason string
	// Latency is the attempt's wall time.
	Latency time.Duration
	// MaybeAccepted is set when the provider may have taken the message
	// although this attempt did not end Sent: the request was written and
	// no answer came back, or the answer was one that may follow a message
	// the provider took, whatever it does with keys: a 408, 409 or 425, or
	// a 5xx other than 503 (the generic API's 503, like a 429, says the
	// request was not taken; a 503 of an API that promises no such thing
	// is Ambiguous). A row whose attempts run out after such an attempt
	// ends unknown, not dead: "dead" tells the application the user got
	// nothing; and the row never moves to another provider.
	MaybeAccepted bool
	// Connected is set when the attempt got a connection to the provider
	// (TCP and TLS done), whether or not the request was then written: a
	// failure with it unset certainly reached nobody.
	Connected bool
	// OptedOut is set on a Permanent outcome whose answer says the
	// recipient opted out of messages from the sender (Twilio's 21610 and
	// its like: optout.go). The provider took nothing; the number goes on
	// the suppression list, and no provider is called for it again.
	OptedOut bool
}

// Error returns the outcome as last_error text: status, code and reason.
func (o Outcome) Error() string {
	switch {
	case o.HTTPStatus != 0 && o.Code != 0:
		return fmt.Sprintf("http %d, provider code %d: %s", o.HTTPStatus, o.Code, o.Reason)
	case o.HTTPStatus != 0:
		return fmt.Sprintf("http %d: %s", o.HTTPStatus, o.Reason)
	}
	return o.Reason
}
