package provider_test

import (
	"net/http/httptest"
	"testing"

	"github.com/sendonce/sendonce/internal/provider"
)

// Each adapter's documented "the recipient opted out" answer is a
// Permanent outcome marked OptedOut (nothing taken, the number to be
// suppressed), in the answer's own shape: Twilio's 400 with 21610 (and the
// generic API's, which shares Twilio's numbering), Telnyx's 40300 with the
// 409 its error reference gives it (a 409 that otherwise may follow a
// message taken), Vonage's 1240. An answer that may follow a message taken
// keeps its doubt, whatever code it carries; another provider's code, or
// another code, is no opt-out; Sinch documents none.
func TestOptedOutAnswers(t *testing.T) {
	t.Parallel()
	tests := []struct {
		adapter string
		status  int
		body    string
		want    provider.Kind
		optOut  bool
	}{
		{"generic not idempotent", 400, `{"code":21610,"message":"Attempt to send to unsubscribed recipient"}`, provider.Permanent, true},
		{"generic idempotent", 400, `{"code":21610,"message":"Attempt to send to unsubscribed recipient"}`, provider.Permanent, true},
		{"generic idempotent", 500, `{"code":21610,"message":"upstream said unsubscribed"}`, provider.Retry, false},
		{"generic not idempotent", 409, `{"code":21610,"message":"in flight"}`, provider.Ambiguous, false},
		{"generic idempotent", 400, `{"code":21211,"message":"invalid To"}`, provider.Permanent, false},
		{"twilio", 400, `{"code":21610,"message":"Attempt to send to unsubscribed recipient","more_info":"https://www.twilio.com/docs/errors/21610","status":400}`, provider.Permanent, true},
		{"twilio", 502, `{"code":21610,"message":"Attempt to send to unsubscribed recipient"}`, provider.Ambiguous, false},
		{"telnyx", 409, `{"errors":[{"code":"40300","title":"Blocked due to STOP message","detail":"Messages cannot be sent from '+15550001111' to '+15551234567' due to an existing block rule.","meta":{"url":"https://developers.telnyx.com/api/errors/40300"}}]}`, provider.Permanent, true},
		{"telnyx", 400, `{"errors":[{"code":"40300","title":"Blocked due to STOP message"}]}`, provider.Permanent, true},
		{"telnyx", 409, `{"errors":[{"code":"10015","title":"Conflict"}]}`, provider.Ambiguous, false},
		{"telnyx", 500, `{"errors":[{"code":"40300","title":"Blocked due to STOP message"}]}`, provider.Ambiguous, false},
		{"telnyx", 400, `{"errors":[{"code":"21610","title":"another provider's code"}]}`, provider.Permanent, false},
		{"vonage", 422, `{"type":"https://developer.nexmo.com/api-errors/messages-olympus#1240","title":"Illegal Number","detail":"The user has opted out"}`, provider.Permanent, true},
		{"vonage", 422, `{"type":"https://developer.nexmo.com/api-errors/messages-olympus#1120","title":"Illegal Sender Address"}`, provider.Permanent, false},
		{"sinch", 403, `{"code":"forbidden","text":"Opted out"}`, provider.Permanent, false},
		{"sinch", 400, `{"code":"21610","text":"not a Sinch code"}`, provider.Permanent, false},
	}
	for _, tt := range tests {
		srv := httptest.NewServer(reply(tt.status, tt.body))
		c := expiryAdapters(t, srv.URL)[tt.adapter]
		o := send(t, c)
		srv.Close()
		if o.Kind != tt.want || o.OptedOut != tt.optOut {
			t.Errorf("%s, %d %s: outcome %v opted out %v, want %v opted out %v", tt.adapter, tt.status, tt.body, o.Kind, o.OptedOut, tt.want, tt.optOut)
		}
		assertNoSecrets(t, o)
	}
}

// A receipt's code says opted out only for the provider whose code it is.
func TestOptedOutCode(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		provider string
		code     int
		want     bool
	}{
		{"twilio", 21610, true}, {"generic", 21610, true}, {"telnyx", 40300, true}, {"vonage", 1240, true},
		{"sinch", 21610, false}, {"telnyx", 21610, false}, {"vonage", 40300, false}, {"twilio", 0, false}, {"twilio", 30003, false},
		{"", 21610, false},
	} {
		if got := provider.OptedOutCode(tt.provider, tt.code); got != tt.want {
			t.Errorf("OptedOutCode(%q, %d) = %v, want %v", tt.provider, tt.code, got, tt.want)
		}
	}
}
