package sender

import (
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sendonce/sendonce/internal/outbox"
	"github.com/sendonce/sendonce/internal/provider"
)

// attribute: which messages found by number and text are the row's, and
// whether its twins leave the answer open.
func TestAttribute(t *testing.T) {
	t.Parallel()
	a := provider.Found{Ref: "SMa", Status: "delivered"}
	b := provider.Found{Ref: "SMb", Status: "accepted"}
	c := provider.Found{Ref: "SMc", Status: "undelivered"}
	twin := func(ref string) outbox.Twin {
		return outbox.Twin{ID: uuid.New(), Status: outbox.StatusSent, ProviderRef: ref}
	}
	anon := outbox.Twin{ID: uuid.New(), Status: outbox.StatusUnknown}
	tests := []struct {
		name       string
		found      []provider.Found
		own        string
		twins      []outbox.Twin
		mine       []provider.Found
		settleable bool
	}{
		{"no twins, none found", nil, "", nil, nil, true},
		{"no twins, one found: the row's", []provider.Found{a}, "", nil, []provider.Found{a}, true},
		{"no twins, two found: the row's, sent twice", []provider.Found{a, b}, "", nil, []provider.Found{a, b}, true},
		{"the twin's message dropped, the other the row's", []provider.Found{a, b}, "", []outbox.Twin{twin("SMa")}, []provider.Found{b}, true},
		{"only the twin's message: none is the row's", []provider.Found{a}, "", []outbox.Twin{twin("SMa")}, nil, true},
		{"twins with known ids that made nothing found", []provider.Found{a}, "", []outbox.Twin{twin("SMx"), twin("SMy")}, []provider.Found{a}, true},
		{"a twin without an id may own what is found", []provider.Found{a}, "", []outbox.Twin{anon}, []provider.Found{a}, false},
		{"a twin without an id, nothing found", nil, "", []outbox.Twin{anon}, nil, true},
		{"a twin without an id, only a known twin's found", []provider.Found{a}, "", []outbox.Twin{anon, twin("SMa")}, nil, true},
		{"the row's own id found: that one", []provider.Found{a, b}, "SMb", []outbox.Twin{anon}, []provider.Found{b}, true},
		{"own id found, the rest the row's too: sent twice", []provider.Found{a, b, c}, "SMb", []outbox.Twin{twin("SMc")}, []provider.Found{a, b}, true},
		{"own id found alone", []provider.Found{b}, "SMb", nil, []provider.Found{b}, true},
		{"own id known, not found, others are: contradiction", []provider.Found{a}, "SMb", nil, []provider.Found{a}, false},
		{"own id known, nothing found: not none", nil, "SMb", nil, nil, false},
		{"own id known, only a twin's found: not none", []provider.Found{a}, "SMb", []outbox.Twin{twin("SMa")}, nil, false},
		{"a twin holds the row's own id: contradiction", []provider.Found{b}, "SMb", []outbox.Twin{twin("SMb")}, nil, false},
	}
	for _, tt := range tests {
		mine, ok := attribute(tt.found, tt.own, tt.twins)
		if ok != tt.settleable || !slices.Equal(mine, tt.mine) && (len(mine) > 0 || len(tt.mine) > 0) {
			t.Errorf("%s: attribute = %v, %v; want %v, %v", tt.name, mine, ok, tt.mine, tt.settleable)
		}
	}
}

// twinsSince reaches back from the earliest message found by the longest
// attempt and the clock margin.
func TestTwinsSince(t *testing.T) {
	t.Parallel()
	since := time.Date(2030, 1, 2, 3, 0, 0, 0, time.UTC)
	at := func(m int) time.Time { return since.Add(time.Duration(m) * time.Minute) }
	timeout := 10 * time.Second
	tests := []struct {
		name  string
		found []provider.Found
		want  time.Time
	}{
		{"nothing found: the lookup's window", nil, at(-2).Add(-timeout)},
		{"the earliest creation", []provider.Found{{Ref: "a", Created: at(7)}, {Ref: "b", Created: at(5)}}, at(4).Add(-timeout)},
		{"one without a creation time: the window", []provider.Found{{Ref: "a", Created: at(7)}, {Ref: "b"}}, at(-2).Add(-timeout)},
	}
	for _, tt := range tests {
		if got := twinsSince(since, tt.found, timeout); !got.Equal(tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}
