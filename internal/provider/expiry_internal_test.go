package provider

import (
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
