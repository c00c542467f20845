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
