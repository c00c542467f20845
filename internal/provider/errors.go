package provider

import "errors"

// The errors of this package that a caller may act on, matched with
// errors.Is: each says what the caller can still do, where an error's text
// only says what went wrong.

// ErrLookupIncomplete is a lookup that could not read every message that
// may be the row's (more pages than it may read, a message it cannot
// read): its answer is neither none nor a count, and the lookup is asked
// again later. Match it with errors.Is.
var ErrLookupIncomplete = errors.New("lookup incomplete")

// ErrNoLookup is a lookup asked of a client that cannot make one: Lookup on
// a client built without lookups (CanLookup is false), and an adapter's
// refusal of its Config's Lookup because its provider offers none
// (ErrVonageNoLookup and ErrTelnyxNoLookup match it). No later attempt
// gets an answer; the caller settles the row some other way.
var ErrNoLookup = errors.New("lookup not enabled")

// ErrVonageNoLookup is NewVonage's refusal of VonageConfig.Lookup.
var ErrVonageNoLookup error = noLookup("provider: vonage offers no lookup by our reference: the Messages API has no read of a message, and the Reports API's synchronous records are found by Vonage's message UUID, which a lost answer never gave us")

// ErrTelnyxNoLookup is NewTelnyx's refusal of TelnyxConfig.Lookup.
var ErrTelnyxNoLookup error = noLookup("provider: telnyx offers no lookup by our reference: GET /v2/messages/{id} needs Telnyx's message id, which a lost answer never gave us, and the detail record searches filter by number and time without our reference or the text, so they cannot tell our message from another to the same number")

// noLookup is an adapter's refusal of lookups, in words that say why its
// provider offers none; it matches ErrNoLookup.
type noLookup string

func (e noLookup) Error() string { return string(e) }

// Is makes every adapter's refusal an ErrNoLookup.
func (e noLookup) Is(target error) bool { return target == ErrNoLookup }
