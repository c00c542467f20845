package provider

import (
	"net/http"
	"testing"
	"time"
)

// The generic API's expires_at is the expiry itself, in UTC, to the
// precision it has; none without one.
func TestGenericExpiresAt(t *testing.T) {
	t.Parallel()
	paris := time.FixedZone("CET", 3600)
	for _, tt := range []struct {
		in   time.Time
		want string
	}{
		{time.Time{}, ""},
		{time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC), "2030-01-02T03:04:05Z"},
		{time.Date(2030, 1, 2, 3, 4, 5, 678_000_000, time.UTC), "2030-01-02T03:04:05.678Z"},
		{time.Date(2030, 1, 2, 3, 4, 5, 678_901_000, time.UTC), "2030-01-02T03:04:05.678901Z"},
		{time.Date(2030, 1, 2, 3, 4, 5, 1, time.UTC), "2030-01-02T03:04:05.000000001Z"},
		{time.Date(2030, 1, 2, 4, 4, 5, 500_000_000, paris), "2030-01-02T03:04:05.5Z"},
		{time.Date(2030, 1, 1, 0, 30, 0, 0, paris), "2029-12-31T23:30:00Z"},
	} {
		if got := genericExpiresAt(tt.in); got != tt.want {
			t.Errorf("genericExpiresAt(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// Twilio's ValidityPeriod is the time left rounded down to whole seconds,
// clamped to the document's 1 to 36000: less than a second left gets the
// minimum, more than ten hours the maximum (Twilio's default).
func TestTwilioValidityPeriod(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		left time.Duration
		want int
	}{
		{-time.Hour, 1}, // never asked of it (no request is built), but still in bounds
		{0, 1},
		{time.Nanosecond, 1},
		{400 * time.Millisecond, 1},
		{999 * time.Millisecond, 1},
		{time.Second, 1},
		{1999 * time.Millisecond, 1},
		{2 * time.Second, 2},
		{time.Minute - time.Nanosecond, 59},
		{time.Hour, 3600},
		{time.Hour - time.Millisecond, 3599},
		{36000*time.Second - time.Nanosecond, 35999},
		{36000 * time.Second, 36000},
		{36000*time.Second + 500*time.Millisecond, 36000},
		{36001 * time.Second, 36000},
		{72 * time.Hour, 36000},
		{1<<63 - 1, 36000},
	} {
		if got := twilioValidityPeriod(tt.left); got != tt.want {
			t.Errorf("twilioValidityPeriod(%v) = %d, want %d", tt.left, got, tt.want)
		}
	}
}

// Sinch's expire_at is the expiry, in UTC to the millisecond rounded down,
// at least a second and at most three days after the request is built.
func TestSinchExpireAt(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 2, 3, 4, 5, 123_456_789, time.UTC)
	paris := time.FixedZone("CET", 3600)
	for _, tt := range []struct {
		name    string
		expires time.Time
		want    string
	}{
		{"an hour left", now.Add(time.Hour), "2030-01-02T04:04:05.123Z"},
		{"to the millisecond, rounded down", time.Date(2030, 1, 2, 3, 34, 5, 999_999_999, time.UTC), "2030-01-02T03:34:05.999Z"},
		{"a whole second", time.Date(2030, 1, 2, 3, 34, 5, 0, time.UTC), "2030-01-02T03:34:05.000Z"},
		{"in another zone", time.Date(2030, 1, 2, 5, 0, 0, 250_000_000, paris), "2030-01-02T04:00:00.250Z"},
		{"0.4 s left: a second", now.Add(400 * time.Millisecond), "2030-01-02T03:04:06.123Z"},
		{"a second left", now.Add(time.Second), "2030-01-02T03:04:06.123Z"},
		{"just over a second", now.Add(time.Second + time.Millisecond), "2030-01-02T03:04:06.124Z"},
		{"none left (never asked: no request is built)", now, "2030-01-02T03:04:06.123Z"},
		{"three days left", now.Add(72 * time.Hour), "2030-01-05T03:04:05.123Z"},
		{"three days and a millisecond: three days", now.Add(72*time.Hour + time.Millisecond), "2030-01-05T03:04:05.123Z"},
		{"a month left: three days", now.AddDate(0, 1, 0), "2030-01-05T03:04:05.123Z"},
	} {
		if got := sinchExpireAt(tt.expires, now); got != tt.want {
			t.Errorf("%s: sinchExpireAt = %q, want %q", tt.name, got, tt.want)
		}
	}
}

// Code 30036 on a 4xx is the generic API's "expired on arrival" only: an
// adapter reads it as that provider's refusal, never as an expiry.
func TestExpiredCodeIsTheGenericAPIs(t *testing.T) {
	t.Parallel()
	generic, err := New(Config{BaseURL: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	telnyx, err := NewTelnyx(TelnyxConfig{BaseURL: "http://127.0.0.1:1", APIKey: "k", From: "+15550100"})
	if err != nil {
		t.Fatal(err)
	}
	resp := &http.Response{StatusCode: 400, Header: http.Header{}, Body: http.NoBody}
	if o := generic.classify(resp, []byte(`{"code":30036,"message":"expired"}`), nil, Message{}); o.Kind != Expired {
		t.Fatalf("generic API, 400 with code 30036: %v, want expired", o.Kind)
	}
	if o := telnyx.classify(resp, []byte(`{"errors":[{"code":"30036","title":"Refused"}]}`), nil, Message{}); o.Kind == Expired || o.Code != 30036 {
		t.Fatalf("Telnyx, 400 with code 30036: %v (code %d), want a refusal that is not an expiry", o.Kind, o.Code)
	}
}
