package provider

import "slices"

// The error codes with which each provider says that the recipient opted
// out of messages from the sender (replied STOP, or the like). Such a
// refusal is not a message that could not be sent: it is consent
// withdrawn, and sendonce puts the number on its suppression list so that
// no provider is called for it again (docs/consent.md).
const (
	// CodeTwilioOptedOut is Twilio's error 21610, "Attempt to send to
	// unsubscribed recipient" (twilio.com/docs/api/errors/21610): the
	// number replied STOP to the sender or its messaging service, and the
	// send is refused with a 400, nothing sent. The generic API shares
	// Twilio's numbering (DefaultPermanentCodes), so it means the same
	// there.
	CodeTwilioOptedOut = 21610
	// CodeTelnyxOptedOut is Telnyx's error 40300, "Blocked due to STOP
	// message" (developers.telnyx.com/api/errors/40300, and "Advanced
	// Opt-In/Out": "Subsequent attempts to message a destination will be
	// blocked at the API level with a 40300 error code"): its HTTP status
	// is 409, which for any other code may follow a message taken; with
	// this code it is a refusal. It may also come in a message's
	// message.finalized webhook.
	CodeTelnyxOptedOut = 40300
	// CodeVonageOptedOut is Vonage's Messages API error 1240, "Illegal
	// Number: You tried to send a message to a blacklisted phone number.
	// That is, the user has already sent a STOP opt-out message"
	// (x-errors of the Messages API's OpenAPI document,
	// testdata/vonage/messages-olympus.yml). Vonage answers the send 202
	// and reports the block in the status webhook ("Messaging Opted-out
	// Numbers", developer.vonage.com/en/opt-out-assist): a receipt with
	// this code puts the number on the list.
	CodeVonageOptedOut = 1240
)

// Sinch documents no such code: its SMS REST API refuses a batch for its
// syntax or the account (testdata/sinch/sms.yaml, the send's 400 and 403),
// and its delivery reports' status "Deleted" ("may happen if the
// destination is an invalid MSISDN or opted out subscriber") does not tell
// an opted-out number from an invalid one. A Sinch opt-out reaches the
// list through the recipient's keyword (/v1/inbound/sinch).

// optOutCodes are the codes each provider (by its SMS_PROVIDERS name, which
// is also its receipts' source) uses for an opted-out recipient, in an
// answer to a send or in a receipt.
var optOutCodes = map[string][]int{
	"generic": {CodeTwilioOptedOut},
	"twilio":  {CodeTwilioOptedOut},
	"telnyx":  {CodeTelnyxOptedOut},
	"vonage":  {CodeVonageOptedOut},
}

// OptedOutCode reports whether code, from the provider named provider
// (generic, twilio, vonage, sinch or telnyx), says the recipient opted
// out: a receipt with it puts the number on the suppression list.
func OptedOutCode(provider string, code int) bool {
	return code != 0 && slices.Contains(optOutCodes[provider], code)
}
