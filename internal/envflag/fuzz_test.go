package envflag_test

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/testing/testkit"
)

// FuzzParse feeds arbitrary environment values and arguments to a set with
// every kind of setting: parsing never panics, and every error names the
// variable or flag it is about.
func FuzzParse(f *testing.F) {
	f.Add("500", "1.5", "10s", "true", "json", "nats://127.0.0.1:4222", "-n=3")
	f.Add("", "", "", "", "", "", "")
	f.Add("-1", "NaN", "5", "maybe", "xml", "http://x", "-d=-1s")
	f.Add("99999999999999999999", "1e400", "9223372036854775807ns", "1", "text", "nats://", "-bogus")
	f.Fuzz(func(t *testing.T, n, fl, d, b, enum, url, arg string) {
		env := map[string]string{"N": n, "F": fl, "D": d, "B": b, "E": enum, "U": url}
		s := envflag.New("fuzz", testkit.EnvMap(env), io.Discard)
		var (
			ni   int
			ff   float64
			dd   time.Duration
			bb   bool
			ee   string
			uu   string
			need string
		)
		s.Int(&ni, "n", "N", 1, 0, 1000, "an int")
		s.Float(&ff, "f", "F", 0.5, 0, 1, "a float")
		s.Duration(&dd, "d", "D", time.Second, 0, time.Hour, "a duration")
		s.Bool(&bb, "b", "B", false, "a bool")
		s.Enum(&ee, "e", "E", "json", []string{"json", "text"}, "an enum")
		s.String(&uu, "u", "U", "nats://127.0.0.1:4222", "a url")
		s.URL(&uu, "u", "nats", "tls")
		s.String(&need, "r", "R", "set", "required")
		s.Required(&need, "r")
		err := s.Parse(strings.Fields(arg))
		if err == nil {
			if ni < 0 || ni > 1000 || dd < 0 || dd > time.Hour || (ee != "json" && ee != "text") {
				t.Fatalf("accepted out-of-range values: %d %v %q", ni, dd, ee)
			}
			return
		}
		msg := err.Error()
		named := false
		for _, name := range []string{"N", "F", "D", "B", "E", "U", "R", "-n", "-f", "-d", "-b", "-e", "-u", "-r", "flag", "help"} {
			if strings.Contains(msg, name) {
				named = true
			}
		}
		if !named {
			t.Fatalf("error names no setting: %q", msg)
		}
	})
}
