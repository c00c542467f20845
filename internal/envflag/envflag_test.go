package envflag_test

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sendonce/sendonce/internal/envflag"
	"github.com/sendonce/sendonce/internal/testing/testkit"
)

// config is a program's settings, bound the way cmd/ binds them.
type config struct {
	dbURL, natsURL, mode, apiKey string
	workers                      int
	ratio                        float64
	timeout                      time.Duration
	verbose                      bool
}

// setup binds every kind of setting to a Set reading env; the returned
// buffer collects the Set's output.
func setup(t *testing.T, env map[string]string) (*envflag.Set, *config, *bytes.Buffer) {
	t.Helper()
	var out bytes.Buffer
	s := envflag.New("prog", testkit.EnvMap(env), &out)
	c := &config{}
	s.String(&c.dbURL, "database-url", "DATABASE_URL", "", "Postgres URL")
	s.Required(&c.dbURL, "database-url")
	s.String(&c.natsURL, "nats-url", "NATS_URL", "nats://127.0.0.1:4222", "NATS URL")
	s.URL(&c.natsURL, "nats-url", "nats", "tls")
	s.Enum(&c.mode, "mode", "MODE", "fast", []string{"fast", "safe"}, "how to run")
	s.Secret(&c.apiKey, "api-key", "API_KEY", "provider API key")
	s.Int(&c.workers, "workers", "WORKERS", 8, 1, 64, "worker count")
	s.Float(&c.ratio, "ratio", "RATIO", 0.5, 0, 1, "a fraction")
	s.Duration(&c.timeout, "timeout", "TIMEOUT", 10*time.Second, time.Millisecond, time.Minute, "attempt timeout")
	s.Bool(&c.verbose, "verbose", "VERBOSE", false, "log more")
	return s, c, &out
}

// base is the least environment that parses.
func base(kv ...string) map[string]string {
	env := map[string]string{"DATABASE_URL": "postgres://127.0.0.1/db"}
	for i := 0; i+1 < len(kv); i += 2 {
		env[kv[i]] = kv[i+1]
	}
	return env
}

func TestSources(t *testing.T) {
	t.Parallel()
	defaults := config{dbURL: "postgres://127.0.0.1/db", natsURL: "nats://127.0.0.1:4222", mode: "fast", workers: 8, ratio: 0.5, timeout: 10 * time.Second}
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want func(c *config)
	}{
		{name: "defaults", env: base(), want: func(*config) {}},
		{name: "environment", env: base("NATS_URL", "tls://nats:4222", "MODE", "safe", "API_KEY", "k1", "WORKERS", " 16 ", "RATIO", "0.25", "TIMEOUT", "250ms", "VERBOSE", "true"),
			want: func(c *config) {
				c.natsURL, c.mode, c.apiKey, c.workers, c.ratio, c.timeout, c.verbose = "tls://nats:4222", "safe", "k1", 16, 0.25, 250*time.Millisecond, true
			}},
		{name: "flags", env: base(), args: []string{"-nats-url", "nats://b:1", "-mode=safe", "-workers", "2", "-ratio", "1", "-timeout", "1m", "-verbose", "-database-url", "postgres://other/db"},
			want: func(c *config) {
				c.natsURL, c.mode, c.workers, c.ratio, c.timeout, c.verbose, c.dbURL = "nats://b:1", "safe", 2, 1, time.Minute, true, "postgres://other/db"
			}},
		{name: "flags override the environment",
			env:  base("NATS_URL", "tls://nats:4222", "MODE", "safe", "API_KEY", "k1", "WORKERS", "16", "RATIO", "0.25", "TIMEOUT", "250ms", "VERBOSE", "true"),
			args: []string{"-nats-url", "nats://b:1", "-mode", "fast", "-workers", "3", "-ratio", "0.75", "-timeout", "2s", "-verbose=false"},
			want: func(c *config) {
				c.natsURL, c.mode, c.apiKey, c.workers, c.ratio, c.timeout, c.verbose = "nats://b:1", "fast", "k1", 3, 0.75, 2*time.Second, false
			}},
		{name: "an empty variable is unset", env: base("WORKERS", "", "MODE", ""), want: func(*config) {}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, got, _ := setup(t, tt.env)
			if err := s.Parse(tt.args); err != nil {
				t.Fatalf("Parse: %v", err)
			}
			want := defaults
			tt.want(&want)
			if *got != want {
				t.Errorf("got %+v\nwant %+v", *got, want)
			}
		})
	}
}

func TestErrorsNameTheSetting(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  map[string]string
		args []string
		// want are substrings of the error; absent must not appear in it.
		want   []string
		absent []string
	}{
		{name: "bad int variable", env: base("WORKERS", "many"), want: []string{"WORKERS", "not an integer"}},
		{name: "bad float variable", env: base("RATIO", "half"), want: []string{"RATIO", "not a number"}},
		{name: "bad duration variable", env: base("TIMEOUT", "10"), want: []string{"TIMEOUT", "duration"}},
		{name: "bad bool variable", env: base("VERBOSE", "yes please"), want: []string{"VERBOSE", "boolean"}},
		{name: "every bad variable at once", env: base("WORKERS", "x", "RATIO", "y", "TIMEOUT", "z"), want: []string{"WORKERS", "RATIO", "TIMEOUT"}},
		// The variable is wrong even if a flag wins: start-up stays loud.
		{name: "bad variable under a good flag", env: base("WORKERS", "x"), args: []string{"-workers", "4"}, want: []string{"WORKERS"}},

		{name: "bad int flag", env: base(), args: []string{"-workers", "many"}, want: []string{"-workers"}},
		{name: "bad duration flag", env: base(), args: []string{"-timeout=10"}, want: []string{"-timeout"}},
		{name: "bad bool flag", env: base(), args: []string{"-verbose=maybe"}, want: []string{"-verbose"}},
		{name: "unknown flag", env: base(), args: []string{"-nope"}, want: []string{"-nope"}},

		{name: "int below range from env", env: base("WORKERS", "0"), want: []string{"-workers", "WORKERS", "between 1 and 64"}},
		{name: "int above range from flag", env: base(), args: []string{"-workers", "65"}, want: []string{"-workers", "WORKERS", "between 1 and 64"}},
		{name: "float out of range", env: base("RATIO", "1.5"), want: []string{"-ratio", "RATIO"}},
		{name: "float NaN", env: base("RATIO", "NaN"), want: []string{"-ratio", "RATIO"}},
		{name: "float infinity", env: base(), args: []string{"-ratio", "+Inf"}, want: []string{"-ratio", "RATIO"}},
		{name: "duration below range", env: base("TIMEOUT", "0s"), want: []string{"-timeout", "TIMEOUT", "between 1ms and 1m0s"}},
		{name: "negative duration", env: base(), args: []string{"-timeout", "-1s"}, want: []string{"-timeout", "TIMEOUT"}},

		{name: "required missing", env: map[string]string{}, want: []string{"-database-url", "DATABASE_URL", "required"}},
		{name: "required blank", env: base("DATABASE_URL", "  "), want: []string{"-database-url", "DATABASE_URL", "required"}},
		{name: "required blank flag", env: base(), args: []string{"-database-url", ""}, want: []string{"-database-url", "DATABASE_URL"}},

		{name: "enum from env", env: base("MODE", "turbo"), want: []string{"-mode", "MODE", "fast, safe"}},
		{name: "enum from flag", env: base(), args: []string{"-mode", "FAST"}, want: []string{"-mode", "MODE"}},

		{name: "URL wrong scheme", env: base("NATS_URL", "http://nats:4222"), want: []string{"-nats-url", "NATS_URL", "nats or tls"}},
		{name: "URL without scheme", env: base("NATS_URL", "127.0.0.1:4222"), want: []string{"-nats-url", "NATS_URL"}},
		{name: "URL without host", env: base("NATS_URL", "nats://"), want: []string{"-nats-url", "NATS_URL"}},
		{name: "URL error hides credentials", env: base("NATS_URL", "https://user:hunter2@nats:4222"), want: []string{"NATS_URL"}, absent: []string{"hunter2"}},

		{name: "every failed check at once", env: map[string]string{"MODE": "x", "WORKERS": "99"}, want: []string{"DATABASE_URL", "MODE", "WORKERS"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, _, _ := setup(t, tt.env)
			err := s.Parse(tt.args)
			if err == nil {
				t.Fatal("Parse succeeded, want an error")
			}
			if errors.Is(err, flag.ErrHelp) {
				t.Fatalf("Parse = %v, a help request", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
			for _, a := range tt.absent {
				if strings.Contains(err.Error(), a) {
					t.Errorf("error %q holds %q", err, a)
				}
			}
		})
	}
}

func TestCheck(t *testing.T) {
	t.Parallel()
	s, c, _ := setup(t, base("WORKERS", "4"))
	s.Check(func() error {
		if c.workers < 10 && c.mode == "fast" {
			return errors.New("fast mode needs 10 workers")
		}
		return nil
	})
	s.Check(func() error { return nil })
	if err := s.Parse(nil); err == nil || !strings.Contains(err.Error(), "10 workers") {
		t.Errorf("Parse = %v, want the cross-setting error", err)
	}
	if err := s.Parse([]string{"-mode", "safe"}); err != nil {
		t.Errorf("Parse with the check satisfied: %v", err)
	}
}

func TestSecretFromFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	lf := file("lf", "s3cret-lf\n")
	crlf := file("crlf", "s3cret-crlf\r\n\r\n")
	bare := file("bare", "s3cret-bare")
	inner := file("inner", "two\nlines\n")
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string
		err  []string // substrings of the error, nil when none
	}{
		{name: "variable", env: base("API_KEY", "s3cret-env"), want: "s3cret-env"},
		{name: "file with LF", env: base("API_KEY_FILE", lf), want: "s3cret-lf"},
		{name: "file with CRLF", env: base("API_KEY_FILE", crlf), want: "s3cret-crlf"},
		{name: "file without newline", env: base("API_KEY_FILE", bare), want: "s3cret-bare"},
		{name: "only trailing newlines go", env: base("API_KEY_FILE", inner), want: "two\nlines"},
		// A command line shows in ps: a secret has no flag, and the error
		// names the variables to use, never the value.
		{name: "flag refused", env: base(), args: []string{"-api-key", "s3cret-flag"}, err: []string{"-api-key", "API_KEY or API_KEY_FILE", "command line"}},
		{name: "flag= refused", env: base("API_KEY_FILE", lf), args: []string{"--api-key=s3cret-flag"}, err: []string{"-api-key", "API_KEY_FILE"}},
		{name: "flag refused after others", env: base(), args: []string{"-workers", "2", "-api-key", "s3cret-flag"}, err: []string{"-api-key"}},
		{name: "unset", env: base(), want: ""},
		{name: "both set", env: base("API_KEY", "s3cret-env", "API_KEY_FILE", lf), err: []string{"API_KEY and API_KEY_FILE"}},
		{name: "missing file", env: base("API_KEY_FILE", filepath.Join(dir, "nope")), err: []string{"API_KEY_FILE"}},
		{name: "directory", env: base("API_KEY_FILE", dir), err: []string{"API_KEY_FILE"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, c, out := setup(t, tt.env)
			err := s.Parse(tt.args)
			if tt.err == nil {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				if c.apiKey != tt.want {
					t.Errorf("secret = %q, want %q", c.apiKey, tt.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("Parse succeeded with secret %q, want an error", c.apiKey)
			}
			for _, w := range tt.err {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
			if strings.Contains(err.Error()+out.String(), "s3cret") {
				t.Errorf("error or output holds the secret: %q / %q", err, out)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key")
	if err := os.WriteFile(keyFile, []byte("s3cret-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		env  map[string]string
	}{
		{name: "nothing set", env: map[string]string{}},
		{name: "secret in the environment", env: base("API_KEY", "s3cret-env", "DATABASE_URL", "postgres://app:s3cret-pw@db:5432/x")},
		{name: "secret in a file", env: base("API_KEY_FILE", keyFile, "NATS_URL", "nats://token:s3cret-token@nats:4222")},
	}
	for _, tt := range tests {
		for _, arg := range []string{"-h", "-help", "--help"} {
			t.Run(tt.name+"/"+arg, func(t *testing.T) {
				t.Parallel()
				s, _, out := setup(t, tt.env)
				if err := s.Parse([]string{arg}); !errors.Is(err, flag.ErrHelp) {
					t.Fatalf("Parse(%s) = %v, want flag.ErrHelp", arg, err)
				}
				usage := out.String()
				for _, w := range []struct{ flag, env, def string }{
					{"-database-url", "DATABASE_URL", `""`},
					{"-nats-url", "NATS_URL", "nats://127.0.0.1:4222"},
					{"-mode", "MODE", "fast"},
					{"-workers", "WORKERS", "8"},
					{"-ratio", "RATIO", "0.5"},
					{"-timeout", "TIMEOUT", "10s"},
					{"-verbose", "VERBOSE", "false"},
				} {
					line := lineWith(usage, w.flag+" ")
					if line == "" {
						t.Errorf("usage does not list %s:\n%s", w.flag, usage)
						continue
					}
					// The built-in default, and whether the variable is set,
					// never the variable's value.
					want := "(env " + w.env + ", default " + w.def + ")"
					if tt.env[w.env] != "" || tt.env[w.env+"_FILE"] != "" {
						want = "(env " + w.env + ", set, default " + w.def + ")"
					}
					if !strings.Contains(line, want) {
						t.Errorf("usage line %q does not contain %q", line, want)
					}
				}
				wantSecret := "API_KEY or API_KEY_FILE  (secret, no flag)"
				if tt.env["API_KEY"] != "" || tt.env["API_KEY_FILE"] != "" {
					wantSecret = "API_KEY or API_KEY_FILE  (secret, no flag, set)"
				}
				if !strings.Contains(usage, wantSecret) || strings.Contains(usage, "-api-key") {
					t.Errorf("usage does not list API_KEY as %q without a flag:\n%s", wantSecret, usage)
				}
				if strings.Contains(usage, "s3cret") {
					t.Errorf("usage prints a secret:\n%s", usage)
				}
			})
		}
	}
}

func lineWith(text, sub string) string {
	for l := range strings.Lines(text) {
		if strings.Contains(l, sub) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

func TestFlagSet(t *testing.T) {
	t.Parallel()
	s, _, _ := setup(t, base())
	fs := s.FlagSet()
	var n int
	fs.IntVar(&n, "extra", 3, "a flag bound directly")
	if err := s.Parse([]string{"-extra", "5"}); err != nil || n != 5 {
		t.Errorf("Parse = %v, extra = %d; want nil, 5", err, n)
	}
	if fs.Lookup("workers") == nil {
		t.Error("FlagSet has no -workers")
	}
}

// Settings lists what was bound, in binding order, with flags bound on the
// FlagSet directly last; usage and the generated docs are built from it.
func TestSettings(t *testing.T) {
	t.Parallel()
	s, _, out := setup(t, base("WORKERS", "16"))
	var n int
	s.FlagSet().IntVar(&n, "down", 0, "revert this many")
	s.Intro("prog does things.\n\n  prog sub   a subcommand\n")
	var names []string
	for _, st := range s.Settings() {
		names = append(names, st.Flag)
	}
	want := "database-url nats-url mode api-key workers ratio timeout verbose down version"
	if got := strings.Join(names, " "); got != want {
		t.Fatalf("Settings order %q, want %q", got, want)
	}
	md := envflag.Markdown(s.Settings())
	for _, row := range []string{
		"| `API_KEY` or `API_KEY_FILE` | none (secret) |  | provider API key |\n",
		"| `WORKERS` | `-workers` | `8` | worker count |\n", // the built-in default, not the environment's
		"|  | `-down` | `0` | revert this many |\n",
	} {
		if !strings.Contains(md, row) {
			t.Errorf("markdown lacks %q:\n%s", row, md)
		}
	}
	if err := s.Parse([]string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Fatal(err)
	}
	if usage := out.String(); !strings.HasPrefix(usage, "prog does things.\n\n  prog sub   a subcommand\n\n") || !strings.Contains(usage, "-down  (default 0)") {
		t.Errorf("usage:\n%s", usage)
	}
}

func TestSections(t *testing.T) {
	t.Parallel()
	doc := "# Configuration\n\n" + envflag.SectionStart("relay") + "\nold table\n" + envflag.SectionEnd("relay") + "\n\ntext after\n"
	if body, ok := envflag.Section(doc, "relay"); !ok || body != "old table\n" {
		t.Fatalf("Section = %q, %v", body, ok)
	}
	out, ok := envflag.ReplaceSection(doc, "relay", "new table\n")
	if !ok || out != strings.Replace(doc, "old table", "new table", 1) {
		t.Fatalf("ReplaceSection = %q, %v", out, ok)
	}
	if _, ok := envflag.Section(doc, "sender"); ok {
		t.Fatal("found a section that is not there")
	}
	if _, ok := envflag.ReplaceSection(doc, "sender", "x"); ok {
		t.Fatal("replaced a section that is not there")
	}
}

func TestCommand(t *testing.T) {
	t.Parallel()
	s, _, out := setup(t, base())
	if code, stop := s.Command(nil); stop || code != 0 {
		t.Fatalf("good settings: exit %d, stop %v", code, stop)
	}
	s, _, out = setup(t, base())
	if code, stop := s.Command([]string{"-h"}); !stop || code != 0 {
		t.Fatalf("-h: exit %d, stop %v", code, stop)
	}
	s, _, out = setup(t, base("WORKERS", "0"))
	if code, stop := s.Command(nil); !stop || code != 2 || !strings.Contains(out.String(), "prog: configuration: -workers / WORKERS = 0") {
		t.Fatalf("bad setting: exit %d, stop %v, output %q", code, stop, out)
	}
}

// -version prints the build and stops, whatever else is set or missing:
// what is running must be readable before anything is configured.
func TestVersion(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"-version"}, {"--version"}, {"-workers", "3", "-version"}} {
		s, _, out := setup(t, base("WORKERS", "0"))
		code, stop := s.Command(args)
		if !stop || code != 0 || !strings.HasPrefix(out.String(), "prog ") || !strings.Contains(out.String(), "go1.") {
			t.Errorf("%v: exit %d, stop %v, output %q; want the build, exit 0", args, code, stop, out)
		}
	}
	if v := envflag.Version(); !strings.Contains(v, "go1.") {
		t.Errorf("Version() = %q, want the Go version in it", v)
	}
}

func TestDurationDefaultsAsTyped(t *testing.T) {
	t.Parallel()
	s := envflag.New("prog", testkit.EnvMap(nil), io.Discard)
	var a, b, c, d time.Duration
	s.Duration(&a, "a", "A", 2*time.Minute, 0, time.Hour, "")
	s.Duration(&b, "b", "B", 168*time.Hour, 0, 1000*time.Hour, "")
	s.Duration(&c, "c", "C", 90*time.Second, 0, time.Hour, "")
	s.Duration(&d, "d", "D", 500*time.Millisecond, 0, time.Hour, "")
	var got []string
	for _, st := range s.Settings() {
		if st.Env != "" {
			got = append(got, st.Default)
		}
	}
	if strings.Join(got, " ") != "2m 168h 1m30s 500ms" {
		t.Fatalf("defaults %q", got)
	}
	if err := s.Parse([]string{"-a", got[0], "-b", got[1]}); err != nil || a != 2*time.Minute || b != 168*time.Hour {
		t.Fatalf("the printed defaults do not parse back: %v", err)
	}
}

// -h lists the settings under their groups' headings, in binding order;
// flags bound without a variable come last, under "other".
func TestHelpGroups(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	s := envflag.New("prog", func(string) string { return "" }, &out)
	var a, b string
	var n int
	s.Group("database")
	s.String(&a, "database-url", "DATABASE_URL", "", "the database")
	s.Group("provider: twilio")
	s.String(&b, "twilio-from", "TWILIO_FROM", "", "the sender")
	s.Int(&n, "workers", "WORKERS", 8, 1, 64, "workers")
	if err := s.Parse([]string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("Parse(-h) = %v", err)
	}
	usage := out.String()
	last := -1
	for _, w := range []string{"\ndatabase:\n", "-database-url", "\nprovider: twilio:\n", "-twilio-from", "-workers", "\nother:\n", "-version"} {
		i := strings.Index(usage, w)
		if i <= last {
			t.Fatalf("%q is not after the line before it in:\n%s", w, usage)
		}
		last = i
	}
}

// Every bad setting matches ErrRefused, and each names what the operator
// sets, so a caller (a wrapper script's test, a readiness check) can say
// which setting to fix without parsing the text.
func TestRefusedSettingsAreTyped(t *testing.T) {
	t.Parallel()
	s, _, _ := setup(t, base("WORKERS", "many", "MODE", "slow", "TIMEOUT", "2h"))
	err := s.Parse(nil)
	if !errors.Is(err, envflag.ErrRefused) {
		t.Fatalf("Parse = %v; want an error matching ErrRefused", err)
	}
	var named []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var se *envflag.SettingError
		if !errors.As(e, &se) {
			t.Fatalf("%v is not a *SettingError", e)
		}
		named = append(named, se.Setting)
	}
	if strings.Join(named, " ") != "WORKERS" {
		t.Fatalf("settings refused before the checks = %v, want [WORKERS] (a value that does not parse stops the checks)", named)
	}
	s, _, _ = setup(t, base("MODE", "slow", "TIMEOUT", "2h"))
	err = s.Parse(nil)
	named = nil
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var se *envflag.SettingError
		if errors.As(e, &se) {
			named = append(named, se.Setting)
		}
	}
	if strings.Join(named, " ") != "MODE TIMEOUT" {
		t.Fatalf("settings refused = %v, want [MODE TIMEOUT]", named)
	}
	s, _, _ = setup(t, base())
	s.Check(func() error { return errors.New("-a and -b go together") })
	var se *envflag.SettingError
	if err := s.Parse(nil); !errors.As(err, &se) || se.Setting != "" || !errors.Is(err, envflag.ErrRefused) {
		t.Fatalf("a failed cross-setting check = %v; want a *SettingError without a setting, matching ErrRefused", err)
	}
	s, _, _ = setup(t, base())
	if err := s.Parse([]string{"-h"}); !errors.Is(err, flag.ErrHelp) || errors.Is(err, envflag.ErrRefused) {
		t.Fatalf("-h = %v; want flag.ErrHelp, not a refusal", err)
	}
}
