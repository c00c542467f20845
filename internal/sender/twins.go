package sender

import (
	"errors"
	"slices"
	"time"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/provider"
)

// errTwins is a lookup by content whose answer the row's twins leave open:
// a message it found may be another row's. The sender treats it as a
// lookup that failed (asked again later; unknown once the budget is
// spent), never as an answer.
var errTwins = errors.New("lookup: a message found may be another row's with the same text to the same number")

// attribute tells which of the messages a lookup by content found
// (provider.Client.LookupByContent: Twilio's number and text) are the
// row's, given the row's own provider id (ownRef: what a status callback
// or an earlier answer recorded; "" when none did) and the rows the lookup
// cannot tell from it (outbox.Twins):
//
//   - a message whose id a twin holds is the twin's, and is dropped;
//   - when ownRef is among the rest, that message is the row's; the others
//     are the row's too (it was sent more than once) unless a twin with no
//     known id may have made them, and then only ownRef's is (the row was
//     sent; a second call would not tell more);
//   - otherwise, when a twin has no known id and messages remain, any of
//     them may be the twin's: not settleable (I7, truth over guesses);
//   - otherwise the rest are the row's: none, one or several, as a lookup
//     by reference would have answered.
//
// Contradictions are not settleable: a twin holding ownRef (one message,
// two rows), or ownRef missing from what the lookup found (it does not show
// what a callback said exists; "none" would send the message again).
func attribute(found []provider.Found, ownRef string, twins []outbox.Twin) (mine []provider.Found, settleable bool) {
	held := make(map[string]bool, len(twins))
	anonymous := false
	for _, tw := range twins {
		if tw.ProviderRef == "" {
			anonymous = true
			continue
		}
		held[tw.ProviderRef] = true
	}
	if ownRef != "" && held[ownRef] {
		return nil, false
	}
	rest := make([]provider.Found, 0, len(found))
	for _, f := range found {
		if !held[f.Ref] {
			rest = append(rest, f)
		}
	}
	own := slices.IndexFunc(rest, func(f provider.Found) bool { return ownRef != "" && f.Ref == ownRef })
	switch {
	case own >= 0 && anonymous:
		return rest[own : own+1], true
	case own >= 0:
		return rest, true
	case ownRef != "":
		return rest, false
	case anonymous && len(rest) > 0:
		return rest, false
	}
	return rest, true
}

// twinsSince is the since to ask outbox.Twins for the messages a lookup
// by content found: the earliest of their creation times (the lookup's
// window start, lookupSince less provider.LookupMargin, when one has none),
// less the longest an attempt runs (attempt: SMS_API_TIMEOUT) and the
// clocks' disagreement (provider.LookupMargin). An attempt that made a
// message created at T was claimed no earlier; a row claimed later has
// updated_at after it.
func twinsSince(lookupSince time.Time, found []provider.Found, attempt time.Duration) time.Time {
	earliest := time.Time{}
	for _, f := range found {
		c := f.Created
		if c.IsZero() {
			c = lookupSince.Add(-provider.LookupMargin)
		}
		if earliest.IsZero() || c.Before(earliest) {
			earliest = c
		}
	}
	if earliest.IsZero() {
		earliest = lookupSince.Add(-provider.LookupMargin)
	}
	return earliest.Add(-attempt - provider.LookupMargin)
}
