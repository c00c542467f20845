package sender

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/provider"
)

func TestOverdueSchedule(t *testing.T) {
	t.Parallel()
	h := time.Hour
	tests := []struct {
		overdue time.Duration
		looks   int
		want    []time.Duration
	}{
		// The defaults: looks at 1, 2, 4, 8 and 16 hours after the send.
		{h, 5, []time.Duration{h, 2 * h, 4 * h, 8 * h, 16 * h}},
		{h, 1, []time.Duration{h}},
		// Doubling stops at a day.
		{6 * h, 4, []time.Duration{6 * h, 12 * h, 24 * h, 24 * h}},
		{30 * h, 2, []time.Duration{24 * h, 24 * h}},
		// A second at least, whatever the setting.
		{time.Millisecond, 2, []time.Duration{time.Second, 2 * time.Second}},
		{h, 0, []time.Duration{h}},
	}
	for _, tt := range tests {
		if got := overdueSchedule(tt.overdue, tt.looks); !slices.Equal(got, tt.want) {
			t.Errorf("overdueSchedule(%s, %d) = %v, want %v", tt.overdue, tt.looks, got, tt.want)
		}
	}
	// Many looks never overflow.
	for _, d := range overdueSchedule(h, 100) {
		if d <= 0 || d > MaxReceiptOverdueDelay {
			t.Fatalf("a delay of %s in 100 looks", d)
		}
	}
}

// Only an unambiguous answer names the row's own message: its provider id
// when the row has one, else (by reference only) the one message found.
func TestOwnMessage(t *testing.T) {
	t.Parallel()
	del := func(ref string) provider.Found { return provider.Found{Ref: ref, Status: "delivered"} }
	tests := []struct {
		name      string
		lr        provider.LookupResult
		ref       string
		byContent bool
		wantRef   string // "" when none is the row's
		want      string
	}{
		{"failed", provider.LookupResult{Err: errors.New("lookup: http 500")}, "m1", false, "", "failed"},
		{"by reference, its id", provider.LookupResult{Found: []provider.Found{del("m1")}}, "m1", false, "m1", "found"},
		{"by reference, its id among several", provider.LookupResult{Found: []provider.Found{del("m2"), del("m1")}}, "m1", false, "m1", "found"},
		{"by reference, another id", provider.LookupResult{Found: []provider.Found{del("m2")}}, "m1", false, "", "several"},
		{"by reference, nothing", provider.LookupResult{}, "m1", false, "", "none"},
		{"by reference, no id, one found", provider.LookupResult{Found: []provider.Found{del("m2")}}, "", false, "m2", "found"},
		{"by reference, no id, two found", provider.LookupResult{Found: []provider.Found{del("m2"), del("m3")}}, "", false, "", "several"},
		{"by reference, no id, none", provider.LookupResult{}, "", false, "", "none"},
		{"by content, its sid", provider.LookupResult{Found: []provider.Found{del("SM2"), del("SM1")}}, "SM1", true, "SM1", "found"},
		// At Twilio a message with the same text to the same number may be
		// another row's: without its sid, nothing is the row's.
		{"by content, another sid", provider.LookupResult{Found: []provider.Found{del("SM2")}}, "SM1", true, "", "none"},
		{"by content, no sid, one found", provider.LookupResult{Found: []provider.Found{del("SM2")}}, "", true, "", "none"},
	}
	for _, tt := range tests {
		own, result, detail := ownMessage(tt.lr, tt.ref, tt.byContent)
		if own.Ref != tt.wantRef || result != tt.want || detail == "" {
			t.Errorf("%s: own %q, result %q (%q); want %q, %q", tt.name, own.Ref, result, detail, tt.wantRef, tt.want)
		}
	}
}
