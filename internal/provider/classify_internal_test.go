package provider

import (
	"bytes"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"
)

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	date := func(d time.Duration) string { return now.Add(d).Format(http.TimeFormat) }
	tests := []struct {
		in      string
		ceiling time.Duration
		want    time.Duration
	}{
		{"", time.Hour, 0},
		{"   ", time.Hour, 0},
		{"0", time.Hour, time.Millisecond},
		{"000", time.Hour, time.Millisecond},
		{"1", time.Hour, time.Second},
		{"120", time.Hour, 120 * time.Second},
		{" 120\t", time.Hour, 120 * time.Second},
		{"0120", time.Hour, 120 * time.Second},
		{"3600", time.Hour, time.Hour},
		{"3601", time.Hour, time.Hour},
		{"86400", time.Hour, time.Hour},
		{"9223372036854775807", time.Hour, time.Hour},
		{"99999999999999999999999", time.Hour, time.Hour},
		{"5", 2 * time.Second, 2 * time.Second},
		{"1", 1500 * time.Millisecond, time.Second},
		{"2", 1500 * time.Millisecond, 1500 * time.Millisecond},
		{"1", 500 * time.Millisecond, 500 * time.Millisecond},
		{"-1", time.Hour, 0},
		{"+5", time.Hour, 0},
		{"1.5", time.Hour, 0},
		{"1e3", time.Hour, 0},
		{"5s", time.Hour, 0},
		{"soon", time.Hour, 0},
		{"1 2", time.Hour, 0},
		{"０", time.Hour, 0}, // fullwidth digit
		{date(90 * time.Second), time.Hour, 90 * time.Second},
		{date(2 * time.Hour), time.Hour, time.Hour},
		{date(0), time.Hour, time.Millisecond},
		{date(-time.Hour), time.Hour, time.Millisecond},
		{"Sun, 06 Nov 1994 08:49:37 GMT", time.Hour, time.Millisecond},
		{"Sunday, 06-Nov-94 08:49:37 GMT", time.Hour, time.Millisecond},       // RFC 850
		{"Sun Nov  6 08:49:37 1994", time.Hour, time.Millisecond},             // ANSI C
		{"Fri, 31 Dec 9999 23:59:59 GMT", time.Hour, time.Hour},               // far future
		{"Mon, 01 Mar 2026 12:01:00 GMT", time.Hour, time.Minute},             // wrong weekday still parses
		{"Sun, 01 Mar 2026 12:01:00 PST", time.Hour, 0},                       // not GMT: not an HTTP-date
		{"2026-03-01T12:01:00Z", time.Hour, 0},                                // RFC 3339 is not an HTTP-date
		{"Sun, 01 Mar 2026 12:01:00 GMT garbage", time.Hour, 0},               // trailing junk
		{"Sun, 32 Mar 2026 12:01:00 GMT", time.Hour, 0},                       // no such day
		{strings.Repeat("9", 10000), time.Hour, time.Hour},                    // long digits
		{strings.Repeat("x", 10000), time.Hour, 0},                            // long junk
		{"Sun, 01 Mar 2026 12:01:00 GMT", 30 * time.Second, 30 * time.Second}, // date capped
	}
	for _, tt := range tests {
		if got := parseRetryAfter(tt.in, now, tt.ceiling); got != tt.want {
			t.Errorf("parseRetryAfter(%.40q, ceiling %s) = %s, want %s", tt.in, tt.ceiling, got, tt.want)
		}
	}
}

// FuzzParseRetryAfter checks that any header value, clock and ceiling gives
// a delay within [0, ceiling], and 0 only for a value that is neither
// delta-seconds nor an HTTP-date.
func FuzzParseRetryAfter(f *testing.F) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).Unix()
	for _, v := range []string{"", "0", "120", "99999999999999999999", "-1", "1.5", "soon",
		"Sun, 01 Mar 2026 12:01:00 GMT", "Sun, 06 Nov 1994 08:49:37 GMT", "Sun Nov  6 08:49:37 1994"} {
		f.Add(v, now, int64(time.Hour))
	}
	f.Fuzz(func(t *testing.T, v string, nowUnix, ceilingNs int64) {
		// A ceiling below 1ms cannot hold the 1ms "now" answer, and New
		// never configures one: keep it in [1ms, max].
		ceiling := time.Duration(ceilingNs)
		if ceiling < time.Millisecond {
			ceiling = time.Millisecond + time.Duration(uint64(ceilingNs)%uint64(time.Hour))
		}
		got := parseRetryAfter(v, time.Unix(nowUnix, 0), ceiling)
		if got < 0 || got > ceiling {
			t.Fatalf("parseRetryAfter(%q, %d, %s) = %s, outside [0, %s]", v, nowUnix, ceiling, got, ceiling)
		}
		trimmed := strings.TrimSpace(v)
		_, dateErr := http.ParseTime(trimmed)
		valid := isDigits(trimmed) || dateErr == nil
		if valid != (got > 0) {
			t.Fatalf("parseRetryAfter(%q) = %s; valid value: %v", v, got, valid)
		}
	})
}

// phoneLike matches four or more digits of any script in a row, allowing up
// to three characters that are neither letters nor digits between two.
var phoneLike = regexp.MustCompile(`\p{Nd}(?:[^\p{L}\p{Nd}]{0,3}\p{Nd}){3,}`)

// numberShapes are the ways a phone number or a one-time code has been
// smuggled past a scrubber: separators of every kind, Unicode spaces and
// hyphens, other scripts' digits, %-escapes.
var numberShapes = []string{
	"+15551234567", "+1 - 555 - 123 - 4567", "555/123/4567", "555_123_4567", "555,123,4567",
	"+1\u00a0555\u00a0123\u00a04567", "+1\u2009555\u2009123\u20094567", "555\u2011123\u20114567",
	"\uff0b\uff11\uff15\uff15\uff15\uff11\uff12\uff13\uff14", "\u0665\u0665\u0665\u0661\u0662\u0663\u0664",
	"555%20123%204567", "%2B1%20555%20123%204567", "482901", "4829", "12345\xff6", "1\u202e2\u009b3\u200d4",
}

func TestScrub(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"", ""},
		{"invalid To", "invalid To"},
		{"code 212", "code 212"},
		{"code 21211", "code #"},
		{"The 'To' number +15551234567 is not valid", "The 'To' number +# is not valid"},
		{"Your code is 4829", "Your code is #"},
		{"call 123", "call 123"},
		{"To +1 555 123 4567.", "To +#."},
		{"To (555) 123-4567!", "To (#!"},
		{"To 555.123.4567", "To #"},
		{"To +1 - 555 - 123 - 4567", "To +#"},
		{"1 to 3, 2 of 9", "1 to 3, 2 of 9"},
		{"1 2 3 4", "#"},
		{"1    2 3 4 5 6", "1    #"}, // four separators break a run
		{"12\xff34", "#"},            // an invalid byte joins, never hides
		{"bidi \u202eevil\u202c and C1 \u009b", "bidi  evil  and C1  "},
		{"isolates \u2066x\u2069 marks \u200ey\u200f\u061c", "isolates  x  marks  y  "},
		{"lines\u2028and\u2029paragraphs\x1b[2J\r\n", "lines and paragraphs [2J  "},
		{"\uff21\uff22", "AB"}, // full-width letters fold to ASCII
		{strings.Repeat("a", 300), strings.Repeat("a", 200)},
		{strings.Repeat("é", 150), strings.Repeat("é", 100)},
		{strings.Repeat("x", 199) + "é", strings.Repeat("x", 199)}, // cut mid rune
	}
	for _, tt := range tests {
		if got := scrub(tt.in); got != tt.want {
			t.Errorf("scrub(%.60q) = %.60q, want %.60q", tt.in, got, tt.want)
		}
	}
	for _, shape := range numberShapes {
		got := scrub("number " + shape + " end")
		if m := phoneLike.FindString(got); m != "" || strings.ContainsFunc(got, hiddenRune) {
			t.Errorf("scrub(%q) = %q lets %q through", shape, got, m)
		}
	}
}

// A provider that echoes the request leaks neither the body nor the number,
// whatever the body holds and however the provider reshapes the echo.
func TestRedact(t *testing.T) {
	t.Parallel()
	m := Message{To: "+15551234567", Body: "Reset link: https://x.example/r/abcDEF"}
	tests := []struct {
		name, in string
		leaks    []string
	}{
		{"whole", "rejected 'Reset link: https://x.example/r/abcDEF' for 15551234567", []string{"abcDEF"}},
		{"truncated", "rejected 'Reset link: https://x.example/r/abcD...'", []string{"abcD", "x.example"}},
		{"tail only", "bad url example/r/abcDEF in body", []string{"abcDEF"}},
		{"re-cased", "REJECTED: RESET LINK: HTTPS://X.EXAMPLE/R/ABCDEF", []string{"ABCDEF", "X.EXAMPLE"}},
		{"other spaces", "rejected 'Reset\u00a0link:\u2009https://x.example/r/abcDEF'", []string{"abcDEF"}},
		{"full-width", "rejected \uff52\uff45\uff53\uff45\uff54 \uff4c\uff49\uff4e\uff4b: https://x.example/r/abcDEF", []string{"abcDEF"}},
		{"number's last digits", "number ending 567 is barred", []string{"567"}},
		{"number's area code", "area (555) not served", []string{"555"}},
		{"number, spaced", "To +1 - 555 - 123 - 4567 refused", []string{"555", "4567"}},
	}
	for _, tt := range tests {
		in, err := strconv.Unquote(`"` + tt.in + `"`)
		if err != nil {
			t.Fatal(err)
		}
		got := scrubFor(in, m)
		for _, leak := range tt.leaks {
			if strings.Contains(got, leak) {
				t.Errorf("%s: scrubFor(%q) = %q keeps %q", tt.name, in, got, leak)
			}
		}
		if phoneLike.MatchString(got) {
			t.Errorf("%s: scrubFor(%q) = %q holds a number", tt.name, in, got)
		}
	}
	// The provider's own words stay: a three-digit run the number does not
	// hold, and text the body does not share.
	if got := scrubFor("code 212: the destination is invalid", m); got != "code 212: the destination is invalid" {
		t.Errorf("scrubFor kept %q of the provider's own text", got)
	}
	short := Message{To: "+15551234567", Body: "OK 42"}
	if got := scrubFor("message 'ok 42' refused", short); strings.Contains(got, "42") {
		t.Errorf("a short body echoed: %q", got)
	}
}

// hiddenRune matches what changes how text shows rather than being part of
// it: C0 and C1 controls, format characters (bidi, zero-width), line and
// paragraph separators.
func hiddenRune(r rune) bool {
	return unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)
}

// FuzzScrub checks that scrubbed text is short, valid UTF-8 and holds no
// number-like run, whatever a provider sends.
func FuzzScrub(f *testing.F) {
	for _, s := range append([]string{"", strings.Repeat("1 ", 200)}, numberShapes...) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := scrub(s)
		if len(got) > 200 || !utf8.ValidString(got) {
			t.Fatalf("scrub(%q) = %q: %d bytes, valid UTF-8 %v", s, got, len(got), utf8.ValidString(got))
		}
		if m := phoneLike.FindString(got); m != "" {
			t.Fatalf("scrub(%q) = %q holds %q", s, got, m)
		}
		if i := strings.IndexFunc(got, hiddenRune); i >= 0 {
			t.Fatalf("scrub(%q) = %q holds the control or format character %U", s, got, []rune(got[i:])[0])
		}
	})
}

// FuzzClassifyBody feeds any status and body to the classifier, as Send
// would after reading at most MaxResponseBytes+1 bytes, and checks the
// outcome against the failure classification of docs/design.md.
func FuzzClassifyBody(f *testing.F) {
	seeds := []struct {
		status int
		body   string
		ra     string
	}{
		{201, `{"id":"msg_1"}`, ""},
		{200, ``, ""},
		{400, `{"code":21211,"message":"The 'To' number +15551234567 is not valid"}`, ""},
		{500, `{"code":"21610"}`, ""},
		{429, `{"code":20429}`, "7"},
		{503, `not json`, "Sun, 01 Mar 2026 12:01:00 GMT"},
		{500, `{"code":30003,"message":"\u00ff\ud800"}`, ""},
		{409, `{"code":1e400}`, ""},
		{302, ``, ""},
	}
	for _, s := range seeds {
		f.Add(s.status, []byte(s.body), s.ra, true)
		f.Add(s.status, []byte(s.body), s.ra, false)
	}
	const maxAfter = 10 * time.Minute
	clients := map[bool]*Client{}
	for _, idem := range []bool{true, false} {
		c, err := New(Config{BaseURL: "http://127.0.0.1:1", Idempotent: idem, PermanentCodes: []int{30003}, MaxRetryAfter: maxAfter})
		if err != nil {
			f.Fatal(err)
		}
		clients[idem] = c
	}
	f.Fuzz(func(t *testing.T, status int, body []byte, retryAfter string, idempotent bool) {
		if status < 200 || status > 599 {
			status = 200 + int(uint(status)%400)
		}
		if len(body) > MaxResponseBytes+1 {
			body = body[:MaxResponseBytes+1]
		}
		c := clients[idempotent]
		resp := &http.Response{StatusCode: status, Header: http.Header{"Retry-After": {retryAfter}}, Body: http.NoBody}
		o := c.classify(resp, body, nil, Message{})

		if o.HTTPStatus != status {
			t.Fatalf("HTTPStatus = %d, want %d", o.HTTPStatus, status)
		}
		if o.Code < 0 {
			t.Fatalf("Code = %d", o.Code)
		}
		if o.Code != 0 && !bytes.Contains(body, []byte(strconv.Itoa(o.Code))) && !bytes.Contains(body, []byte(`\u`)) {
			t.Fatalf("Code %d is not in the body %q", o.Code, body)
		}
		if o.After < 0 || o.After > maxAfter {
			t.Fatalf("After = %s outside [0, %s]", o.After, maxAfter)
		}
		if o.After != 0 && (o.Kind != Retry || (status != 429 && status != 503)) {
			t.Fatalf("After = %s on a %v for status %d", o.After, o.Kind, status)
		}
		if len(o.Ref) > 200 || (o.Ref != "" && o.Kind != Sent) {
			t.Fatalf("Ref = %q on a %v", o.Ref, o.Kind)
		}
		if len(o.Reason) > 200 || !utf8.ValidString(o.Reason) || phoneLike.MatchString(o.Reason) {
			t.Fatalf("Reason = %q: too long, invalid UTF-8 or number-like", o.Reason)
		}
		if o.Kind != Sent && o.Reason == "" {
			t.Fatal("a failure without a Reason")
		}
		// Error() is "http <status>[, provider code <code>]: <Reason>"; the
		// numbers in the prefix are ours, so only what follows must not
		// read as a phone number (the status and a short reason side by
		// side, as in "http 400: 0", are not one).
		prefix := fmt.Sprintf("http %d: ", status)
		if o.Code != 0 {
			prefix = fmt.Sprintf("http %d, provider code %d: ", status, o.Code)
		}
		if !strings.HasPrefix(o.Error(), prefix) {
			t.Fatalf("Error() = %q, want the prefix %q", o.Error(), prefix)
		}
		if m := phoneLike.FindString(strings.TrimPrefix(o.Error(), prefix)); m != "" {
			t.Fatalf("Error() = %q holds %q", o.Error(), m)
		}

		// An answer that may follow a message the provider took is
		// classified by its status, whatever code it carries.
		doubtful := status == 408 || status == 409 || status == 425 || status >= 500
		var want Kind
		switch {
		case status < 300:
			want = Sent
		case o.Code != 0 && slices.Contains(c.permanent, o.Code) && !doubtful:
			want = Permanent
		case status == 429:
			want = Retry
		case (status == 408 || status == 409 || status == 425) && !idempotent:
			want = Ambiguous
		case status == 408 || status == 409 || status == 425:
			want = Retry
		case status >= 500 && idempotent:
			want = Retry
		case status >= 500:
			want = Ambiguous
		default:
			want = Permanent
		}
		if o.Kind != want {
			t.Fatalf("status %d, code %d, idempotent %v: Kind = %v, want %v", status, o.Code, idempotent, o.Kind, want)
		}
		if wantMaybe := doubtful && status != 503; o.MaybeAccepted != wantMaybe {
			t.Fatalf("status %d, code %d, idempotent %v: MaybeAccepted = %v, want %v", status, o.Code, idempotent, o.MaybeAccepted, wantMaybe)
		}
	})
}

// A permanent provider code is believed only on an answer that says the
// provider took nothing: on one that may follow a message it took (a 408,
// 409 or 425, any 5xx) the status's doubt wins, and the answer is
// classified by its status, never Permanent: "dead" is for rows the
// provider never took.
func TestPermanentCodeYieldsToDoubt(t *testing.T) {
	t.Parallel()
	generic := func(idem bool) *Client {
		c, err := New(Config{BaseURL: "http://127.0.0.1:1", Idempotent: idem, PermanentCodes: []int{30003}})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	twilio, err := NewTwilio(TwilioConfig{BaseURL: "http://127.0.0.1:1", AccountSID: "AC1", AuthToken: "t", From: "+15550001111"})
	if err != nil {
		t.Fatal(err)
	}
	clients := []struct {
		name string
		c    *Client
	}{{"generic idempotent", generic(true)}, {"generic not idempotent", generic(false)}, {"twilio", twilio}}
	// want is the kind at a provider that honours keys, and at one that
	// does not; maybe is Outcome.MaybeAccepted.
	tests := []struct {
		status        int
		idem, nonIdem Kind
		maybe         bool
	}{
		// The provider took nothing: the code says no retry can help.
		{status: 400, idem: Permanent, nonIdem: Permanent},
		{status: 403, idem: Permanent, nonIdem: Permanent},
		{status: 404, idem: Permanent, nonIdem: Permanent},
		{status: 422, idem: Permanent, nonIdem: Permanent},
		{status: 429, idem: Permanent, nonIdem: Permanent},
		// The provider may have taken it: the status decides.
		{status: 408, idem: Retry, nonIdem: Ambiguous, maybe: true},
		{status: 409, idem: Retry, nonIdem: Ambiguous, maybe: true},
		{status: 425, idem: Retry, nonIdem: Ambiguous, maybe: true},
		{status: 500, idem: Retry, nonIdem: Ambiguous, maybe: true},
		{status: 501, idem: Retry, nonIdem: Ambiguous, maybe: true},
		{status: 502, idem: Retry, nonIdem: Ambiguous, maybe: true},
		{status: 503, idem: Retry, nonIdem: Ambiguous},
		{status: 504, idem: Retry, nonIdem: Ambiguous, maybe: true},
		{status: 599, idem: Retry, nonIdem: Ambiguous, maybe: true},
	}
	for _, cl := range clients {
		for _, code := range []int{21211, 21214, 21614, 21610, 21612, 30003} {
			if cl.name == "twilio" && code == 30003 {
				continue // configured for the generic clients only
			}
			for _, tt := range tests {
				body := fmt.Sprintf(`{"code":%d,"message":"refused","status":%d}`, code, tt.status)
				resp := &http.Response{StatusCode: tt.status, Header: http.Header{}, Body: http.NoBody}
				o := cl.c.classify(resp, []byte(body), nil, Message{})
				want := tt.nonIdem
				if cl.c.Idempotent() {
					want = tt.idem
				}
				if o.Kind != want || o.MaybeAccepted != tt.maybe || o.Code != code {
					t.Errorf("%s, %d with code %d: %v (maybe accepted %v, code %d), want %v (maybe accepted %v)",
						cl.name, tt.status, code, o.Kind, o.MaybeAccepted, o.Code, want, tt.maybe)
				}
			}
		}
	}
}
