package receiver_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/sendonce/sendonce/internal/receiver"
	"github.com/sendonce/sendonce/internal/testing/nodetools"
)

// twilioCallback is a status callback's form as Twilio posts it.
func twilioCallback(sid, status string) url.Values {
	f := url.Values{
		"MessageSid": {sid}, "SmsSid": {sid}, "AccountSid": {"AC0123456789abcdef0123456789abcdef"},
		"MessageStatus": {status}, "SmsStatus": {status}, "From": {"+15550001111"}, "To": {"+15551234567"},
		"ApiVersion": {"2010-04-01"},
	}
	if status == "undelivered" || status == "failed" {
		f.Set("ErrorCode", "30003")
	}
	return f
}

// Twilio's status callbacks signed by Twilio's own Node SDK
// (getExpectedTwilioSignature) over the URL the adapter gives Twilio (the
// receiver's public URL, /v1/receipts/twilio and ?ref=<row id>) and the
// form: genuine ones move their rows; one signed with another token, or
// whose form or URL (its ref, its path, its host) is not what was signed,
// is refused and changes nothing. For each, the SDK's validateRequest is
// asked too, and must agree with the receiver.
func TestTwilioReceiptsSignedByTwilioSDK(t *testing.T) {
	t.Parallel()
	const public = "https://receipts.example.com"
	f := start(t, func(c *receiver.Config) { c.PublicURL, c.DefaultProvider = public, "twilio" })
	sending, failing, odd, untouched := f.row("sending"), f.row("sending"), f.row("sending"), f.row("sent")
	callbackURL := func(id uuid.UUID) string { return public + "/v1/receipts/twilio?ref=" + url.QueryEscape(id.String()) }
	sid := func(id uuid.UUID) string { return "SM" + strings.ReplaceAll(id.String(), "-", "") }

	// A sender id with what form encoding must get right.
	oddForm := twilioCallback(sid(odd), "delivered")
	oddForm.Set("From", "Acme & Co = ü+ 100%")
	tests := []struct {
		name     string
		id       uuid.UUID  // the row posted for: ?ref=<id>
		form     url.Values // the form posted
		token    string     // signed with; twilioToken unless set
		signURL  string     // signed over; the posted URL unless set
		signForm url.Values // signed; the posted form unless set
		code     int
		result   string
		want     string // the row's status after
	}{
		{name: "sent", id: sending, form: twilioCallback(sid(sending), "sent"), code: 200, result: "applied", want: "sent"},
		{name: "delivered", id: sending, form: twilioCallback(sid(sending), "delivered"), code: 200, result: "applied", want: "delivered"},
		{name: "the same again", id: sending, form: twilioCallback(sid(sending), "delivered"), code: 200, result: "unchanged", want: "delivered"},
		{name: "undelivered, with its error code", id: failing, form: twilioCallback(sid(failing), "undelivered"), code: 200, result: "applied", want: "undelivered"},
		{name: "form fields with & = + % and non-ASCII", id: odd, form: oddForm, code: 200, result: "applied", want: "delivered"},
		{name: "forged: another token", id: untouched, form: twilioCallback(sid(untouched), "delivered"), token: "not-the-twilio-token", code: 401, want: "sent"},
		{name: "altered field: the status", id: untouched, form: twilioCallback(sid(untouched), "delivered"), signForm: twilioCallback(sid(untouched), "sent"), code: 401, want: "sent"},
		{name: "altered field: the sid", id: untouched, form: twilioCallback(sid(untouched), "delivered"), signForm: twilioCallback(sid(sending), "delivered"), code: 401, want: "sent"},
		{name: "a field added", id: untouched, form: func() url.Values { f := twilioCallback(sid(untouched), "delivered"); f.Set("ErrorCode", "0"); return f }(), signForm: twilioCallback(sid(untouched), "delivered"), code: 401, want: "sent"},
		{name: "altered URL: another row's ref", id: untouched, form: twilioCallback(sid(untouched), "delivered"), signURL: callbackURL(sending), code: 401, want: "sent"},
		{name: "altered URL: no query", id: untouched, form: twilioCallback(sid(untouched), "delivered"), signURL: public + "/v1/receipts/twilio", code: 401, want: "sent"},
		{name: "altered URL: another host", id: untouched, form: twilioCallback(sid(untouched), "delivered"), signURL: "https://elsewhere.example.com/v1/receipts/twilio?ref=" + untouched.String(), code: 401, want: "sent"},
	}
	// One run of node signs every case, and one checks every request.
	var signs, checks []nodetools.TwilioCase
	for _, tt := range tests {
		token, u, form := tt.token, tt.signURL, tt.signForm
		if token == "" {
			token = twilioToken
		}
		if u == "" {
			u = callbackURL(tt.id)
		}
		if form == nil {
			form = tt.form
		}
		signs = append(signs, nodetools.TwilioCase{Op: "sign", Token: token, URL: u, Params: form})
	}
	sigs := nodetools.Twilio(t, signs)
	for i, tt := range tests {
		checks = append(checks, nodetools.TwilioCase{Op: "validate", Token: twilioToken, URL: callbackURL(tt.id), Params: tt.form, Signature: sigs[i].Signature})
	}
	valid := nodetools.Twilio(t, checks)
	for i, tt := range tests {
		if valid[i].Valid != (tt.code == 200) {
			t.Errorf("%s: Twilio's validateRequest says %v", tt.name, valid[i].Valid)
		}
		code, result := f.postTwilio(callbackURL(tt.id)[len(public):], tt.form, sigs[i].Signature)
		if code != tt.code || (tt.result != "" && result != tt.result) {
			t.Errorf("%s: %d %q, want %d %q", tt.name, code, result, tt.code, tt.result)
		}
		if st, _ := f.status(tt.id); st != tt.want {
			t.Errorf("%s: row is %s, want %s", tt.name, st, tt.want)
		}
	}
	if _, ref := f.status(failing); ref != sid(failing) {
		t.Errorf("the undelivered row's provider_ref %q, want its sid", ref)
	}
	if n := f.evidence(untouched); n != 0 {
		t.Errorf("refused callbacks left %d evidence rows", n)
	}
	if got := f.count("twilio", "forged"); got != 7 {
		t.Errorf("sendonce_receipts_total{source=twilio,result=forged} = %v, want 7", got)
	}
}

// postTwilio posts form to the receiver's path (and query) with the
// X-Twilio-Signature sig, and returns the status and the result answered.
func (f *fixture) postTwilio(path string, form url.Values, sig string) (int, string) {
	f.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, f.srv.URL+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set(receiver.HeaderTwilioSignature, sig)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	var ans struct{ Result string }
	_ = json.NewDecoder(resp.Body).Decode(&ans)
	return resp.StatusCode, ans.Result
}

// Our SignTwilio against Twilio's SDK, on the edges of the algorithm: a
// repeated field (its distinct values, sorted), an empty value, a URL with
// a query, a port and escapes; the SDK validates each of our signatures,
// and refuses one made with another token.
func TestSignTwilioAgreesWithTwilioSDK(t *testing.T) {
	t.Parallel()
	forms := []url.Values{
		{},
		{"Digits": {"5678", "1234", "1234"}, "Sid": {"CA123"}, "SidAccount": {"AC123"}},
		{"Empty": {""}, "Body": {"ünï & = + % \"code\"\n"}},
		{"b": {"2"}, "a": {"1"}, "B": {"3"}, "a_": {"4"}},
	}
	urls := []string{
		"https://receipts.example.com/v1/receipts/twilio?ref=0b9c6a52-7f0e-4d5c-9a43-2b1f8f1e6a10",
		"https://receipts.example.com:8443/v1/receipts/twilio?ref=a%2Fb&x=1",
		"http://127.0.0.1:8080/v1/receipts/twilio",
	}
	var cases []nodetools.TwilioCase
	for _, u := range urls {
		for _, form := range forms {
			cases = append(cases,
				nodetools.TwilioCase{Op: "sign", Token: twilioToken, URL: u, Params: form},
				nodetools.TwilioCase{Op: "validate", Token: twilioToken, URL: u, Params: form, Signature: receiver.SignTwilio(twilioToken, u, form)},
				nodetools.TwilioCase{Op: "validate", Token: twilioToken, URL: u, Params: form, Signature: receiver.SignTwilio("another-token", u, form)})
		}
	}
	answers := nodetools.Twilio(t, cases)
	for i := 0; i < len(cases); i += 3 {
		c := cases[i]
		if ours := receiver.SignTwilio(c.Token, c.URL, c.Params); ours != answers[i].Signature {
			t.Errorf("case %d (fields %d): SignTwilio %s, Twilio's SDK %s", i/3, len(c.Params), ours, answers[i].Signature)
		}
		if err := receiver.VerifyTwilio(twilioToken, c.URL, c.Params, answers[i].Signature); err != nil {
			t.Errorf("case %d: VerifyTwilio refused the SDK's signature: %v", i/3, err)
		}
		if !answers[i+1].Valid {
			t.Errorf("case %d: Twilio's SDK refused SignTwilio's signature", i/3)
		}
		if answers[i+2].Valid {
			t.Errorf("case %d: Twilio's SDK took a signature made with another token", i/3)
		}
	}
}
