package wire_test

import (
	"encoding/json"
	"errors"
	"math"
	"regexp"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/sendonce/sendonce/internal/wire"
)

const canonical = "6ba7b810-9dad-41d1-80b4-00c04fd430c8"

var canonicalID = uuid.MustParse(canonical)

// decodeError is every message Decode may return: fixed text and sizes,
// never anything taken from the payload.
var decodeError = regexp.MustCompile(`^invalid sms\.send payload: (\d+ bytes, more than \d+|not a JSON object with id and gen|no id|id is not a UUID|negative gen)$`)

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	tests := []wire.Send{
		{ID: canonicalID},
		{ID: canonicalID, Gen: 1},
		{ID: canonicalID, Gen: math.MaxInt32},
		{ID: uuid.UUID{0: 1}, Gen: 7},
		{ID: uuid.Max, Gen: 0},
		{ID: uuid.New(), Gen: 3},
		{ID: uuid.Must(uuid.NewV7()), Gen: 12},
	}
	for _, s := range tests {
		enc := wire.AppendEncode(nil, s)
		want := `{"id":"` + s.ID.String() + `","gen":` + jsonInt(s.Gen) + `}`
		if string(enc) != want {
			t.Errorf("AppendEncode(%+v) = %s, want %s", s, enc, want)
		}
		if !json.Valid(enc) {
			t.Errorf("AppendEncode(%+v) = %s is not JSON", s, enc)
		}
		got, err := wire.Decode(enc)
		if err != nil || got != s {
			t.Errorf("Decode(%s) = %+v, %v; want %+v", enc, got, err, s)
		}
	}
}

func jsonInt(n int32) string {
	b, _ := json.Marshal(n)
	return string(b)
}

func TestAppendEncodeAppends(t *testing.T) {
	t.Parallel()
	prefix := []byte("keep:")
	out := wire.AppendEncode(prefix, wire.Send{ID: canonicalID, Gen: 2})
	if want := `keep:{"id":"` + canonical + `","gen":2}`; string(out) != want {
		t.Errorf("got %s, want %s", out, want)
	}
	// Two payloads in one buffer, as the relay encodes a batch.
	buf := wire.AppendEncode(nil, wire.Send{ID: canonicalID, Gen: 1})
	n := len(buf)
	buf = wire.AppendEncode(buf, wire.Send{ID: uuid.Max, Gen: 2})
	a, errA := wire.Decode(buf[:n])
	b, errB := wire.Decode(buf[n:])
	if errA != nil || errB != nil || a.ID != canonicalID || b.ID != uuid.Max || a.Gen != 1 || b.Gen != 2 {
		t.Errorf("decoded %+v, %v and %+v, %v", a, errA, b, errB)
	}
}

// Not parallel: AllocsPerRun refuses to run beside other tests.
func TestAppendEncodeAllocatesNothing(t *testing.T) {
	buf := make([]byte, 0, 128)
	s := wire.Send{ID: canonicalID, Gen: math.MaxInt32}
	allocs := testing.AllocsPerRun(100, func() { buf = wire.AppendEncode(buf[:0], s) })
	if allocs != 0 {
		t.Errorf("AppendEncode into a preallocated buffer allocates %.1f times per call, want 0", allocs)
	}
}

func TestDecodeAccepts(t *testing.T) {
	t.Parallel()
	pad := func(n int, json string) string { return json + strings.Repeat(" ", n-len(json)) }
	tests := []struct {
		name, in string
		want     wire.Send
	}{
		{"canonical", `{"id":"` + canonical + `","gen":3}`, wire.Send{ID: canonicalID, Gen: 3}},
		{"no gen", `{"id":"` + canonical + `"}`, wire.Send{ID: canonicalID}},
		{"gen null", `{"id":"` + canonical + `","gen":null}`, wire.Send{ID: canonicalID}},
		{"gen first", `{"gen":2,"id":"` + canonical + `"}`, wire.Send{ID: canonicalID, Gen: 2}},
		{"whitespace", " \n{ \"id\" : \"" + canonical + "\" , \"gen\" : 0 }\t", wire.Send{ID: canonicalID}},
		{"unknown fields", `{"id":"` + canonical + `","gen":1,"v":2}`, wire.Send{ID: canonicalID, Gen: 1}},
		// Hex case does not change the UUID, so the key and row are the same.
		{"upper-case hex", `{"id":"` + strings.ToUpper(canonical) + `","gen":1}`, wire.Send{ID: canonicalID, Gen: 1}},
		{"largest gen", `{"id":"` + canonical + `","gen":2147483647}`, wire.Send{ID: canonicalID, Gen: math.MaxInt32}},
		{"exactly MaxPayload", pad(wire.MaxPayload, `{"id":"`+canonical+`","gen":1}`), wire.Send{ID: canonicalID, Gen: 1}},
	}
	for _, tt := range tests {
		got, err := wire.Decode([]byte(tt.in))
		if err != nil || got != tt.want {
			t.Errorf("%s: Decode = %+v, %v; want %+v", tt.name, got, err, tt.want)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	t.Parallel()
	id := func(s string) string { return `{"id":"` + s + `","gen":1}` }
	tests := []struct{ name, in string }{
		{"empty", ``},
		{"not JSON", `sms:+15551234567`},
		{"truncated", `{"id":"` + canonical},
		{"array", `["` + canonical + `"]`},
		{"string", `"` + canonical + `"`},
		{"number", `15551234567`},
		{"null", `null`},
		{"empty object", `{}`},
		{"trailing data", `{"id":"` + canonical + `"} {"id":"` + canonical + `"}`},
		{"missing id", `{"gen":1}`},
		{"null id", `{"id":null,"gen":1}`},
		{"numeric id", `{"id":15551234567,"gen":1}`},
		{"object id", `{"id":{"to":"+15551234567"},"gen":1}`},
		{"empty id", id(``)},
		{"nil UUID", id(`00000000-0000-0000-0000-000000000000`)},
		{"no dashes", id(strings.ReplaceAll(canonical, "-", ""))},
		{"braces", id(`{` + canonical + `}`)},
		{"urn", id(`urn:uuid:` + canonical)},
		{"misplaced dash", id(`6ba7b8109-dad-41d1-80b4-00c04fd430c8`)},
		{"not hex", id(`6ba7b810-9dad-41d1-80b4-00c04fd430cg`)},
		{"too short", id(canonical[:35])},
		{"too long", id(canonical + `0`)},
		{"leading space", id(` ` + canonical[1:])},
		{"trailing space", id(canonical + ` `)},
		{"phone number as id", id(`+15551234567`)},
		{"negative gen", `{"id":"` + canonical + `","gen":-1}`},
		{"smallest gen", `{"id":"` + canonical + `","gen":-2147483648}`},
		{"gen overflow", `{"id":"` + canonical + `","gen":2147483648}`},
		{"fractional gen", `{"id":"` + canonical + `","gen":1.5}`},
		{"exponent gen", `{"id":"` + canonical + `","gen":1e2}`},
		{"string gen", `{"id":"` + canonical + `","gen":"1"}`},
		{"oversize", `{"id":"` + canonical + `","gen":1,"pad":"` + strings.Repeat("5", wire.MaxPayload) + `"}`},
		{"one byte over", `{"id":"` + canonical + `","gen":1}` + strings.Repeat(" ", wire.MaxPayload-len(`{"id":"`+canonical+`","gen":1}`)+1)},
	}
	for _, tt := range tests {
		got, err := wire.Decode([]byte(tt.in))
		if err == nil {
			t.Errorf("%s: Decode(%.60q) = %+v, want an error", tt.name, tt.in, got)
			continue
		}
		if !errors.Is(err, wire.ErrPayload) {
			t.Errorf("%s: error %v does not wrap ErrPayload", tt.name, err)
		}
		if !decodeError.MatchString(err.Error()) {
			t.Errorf("%s: error %q is not one of the fixed messages", tt.name, err)
		}
		if strings.Contains(err.Error(), "5551234567") || strings.Contains(err.Error(), canonical[:8]) {
			t.Errorf("%s: error %q echoes the payload", tt.name, err)
		}
		if got != (wire.Send{}) {
			t.Errorf("%s: Decode returned %+v with its error, want the zero Send", tt.name, got)
		}
	}
}

// FuzzDecode checks that Decode never panics, that what it accepts is a
// usable reference that survives a round trip, and that what it refuses is
// refused with one of its fixed messages.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"id":"` + canonical + `","gen":0}`,
		`{"id":"` + strings.ToUpper(canonical) + `","gen":2147483647}`,
		`{"id":"00000000-0000-0000-0000-000000000000"}`,
		`{"id":"urn:uuid:` + canonical + `"}`,
		`{"id":"` + canonical + `","gen":-1}`,
		`{"gen":1}`, `null`, `[]`, ``, `{"id":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := wire.Decode(data)
		if err != nil {
			if !errors.Is(err, wire.ErrPayload) || !decodeError.MatchString(err.Error()) {
				t.Fatalf("Decode(%q): unexpected error %q", data, err)
			}
			if s != (wire.Send{}) {
				t.Fatalf("Decode(%q) = %+v with error %v", data, s, err)
			}
			return
		}
		if len(data) > wire.MaxPayload || s.ID == uuid.Nil || s.Gen < 0 {
			t.Fatalf("Decode(%q) accepted %+v", data, s)
		}
		again, err := wire.Decode(wire.AppendEncode(nil, s))
		if err != nil || again != s {
			t.Fatalf("round trip of %+v: %+v, %v", s, again, err)
		}
	})
}

func BenchmarkAppendEncode(b *testing.B) {
	buf := make([]byte, 0, 128)
	s := wire.Send{ID: canonicalID, Gen: 3}
	b.ReportAllocs()
	for b.Loop() {
		buf = wire.AppendEncode(buf[:0], s)
	}
}

func BenchmarkDecode(b *testing.B) {
	data := wire.AppendEncode(nil, wire.Send{ID: canonicalID, Gen: 3})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := wire.Decode(data); err != nil {
			b.Fatal(err)
		}
	}
}
