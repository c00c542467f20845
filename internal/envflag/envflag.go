// Package envflag binds each setting of a program to a command-line flag and
// an environment variable: the flag wins, then the variable, then the
// default. A bad value stops start-up with an error naming the flag or the
// variable it came from; "-h" lists every setting with its variable and
// default. Secrets have no flag (a command line shows in ps): they come
// from their variable or from a file named by VAR_FILE.
package envflag

import (
	"errors"
	"flag"
	"fmt"
	"github.com/sendonce/sendonce/internal/build"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// Set is a set of settings.
type Set struct {
	fs     *flag.FlagSet
	getenv func(string) string
	errs   []error
	checks []func() error
	byFlag map[string]string // flag name -> env var
	// builtin is each flag's default before the environment: usage prints
	// it, never a value from the environment, which may hold a credential
	// (a password in DATABASE_URL).
	builtin map[string]string
	secret  map[string]bool
	// secretUsage is each secret's usage: a secret has no flag to hold it.
	secretUsage map[string]string
	order       []string // flags bound with a variable, in binding order
	// groups are -h's headings: groups[i] titles the settings bound from
	// order[groupAt[i]] on.
	groups  []string
	groupAt []int
	intro   string
	name    string
	output  io.Writer
}

// Setting describes one setting, for usage and for the generated
// documentation.
type Setting struct {
	// Flag is the flag's name, without the dash.
	Flag string
	// Env is the environment variable; empty for a flag without one.
	Env string
	// Default is the value when neither is set, as usage prints it.
	Default string
	// Usage says what the setting does.
	Usage string
	// Secret settings have no flag (Flag is only their name): they come
	// from Env or from the file named by Env_FILE, and their values are
	// never printed.
	Secret bool
}

// New returns a Set for the program name. getenv is os.Getenv in main and a
// map lookup in tests.
func New(name string, getenv func(string) string, output io.Writer) *Set {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(output)
	s := &Set{fs: fs, getenv: getenv, byFlag: map[string]string{}, builtin: map[string]string{}, secret: map[string]bool{},
		secretUsage: map[string]string{}, name: name, output: output}
	fs.Bool("version", false, "print the build (module version, VCS revision, Go version) and exit")
	fs.Usage = func() {
		if s.intro != "" {
			fmt.Fprintln(output, strings.TrimRight(s.intro, "\n"))
			fmt.Fprintln(output)
		}
		fmt.Fprintf(output, "Settings of %s (flags override environment variables):\n", name)
		g := 0
		for i, st := range s.Settings() {
			for g < len(s.groups) && s.groupAt[g] == i {
				fmt.Fprintf(output, "\n%s:\n", s.groups[g])
				g++
			}
			if i == len(s.order) && len(s.groups) > 0 {
				fmt.Fprintf(output, "\nother:\n")
			}
			env, def := st.Env, st.Default
			if st.Secret {
				set := ""
				if s.getenv(env) != "" || s.getenv(env+"_FILE") != "" {
					set = ", set"
				}
				fmt.Fprintf(output, "  %s or %s_FILE  (secret, no flag%s)\n      %s\n", env, env, set, st.Usage)
				continue
			}
			if def == "" {
				def = `""`
			}
			if env == "" {
				fmt.Fprintf(output, "  -%s  (default %s)\n      %s\n", st.Flag, def, st.Usage)
				continue
			}
			if s.getenv(env) != "" || s.getenv(env+"_FILE") != "" {
				env += ", set"
			}
			fmt.Fprintf(output, "  -%s  (env %s, default %s)\n      %s\n", st.Flag, env, def, st.Usage)
		}
	}
	return s
}

// Group starts a heading in -h: the settings bound after it, up to the
// next group, are listed under title (database, NATS, a provider, ...).
func (s *Set) Group(title string) {
	s.groups = append(s.groups, title)
	s.groupAt = append(s.groupAt, len(s.order))
}

// Intro sets the text -h prints before the settings: what the program
// does, its subcommands.
func (s *Set) Intro(text string) { s.intro = text }

// Settings returns every setting: those bound with a variable in the order
// they were bound, then flags bound on FlagSet directly, by name.
func (s *Set) Settings() []Setting {
	var out []Setting
	for _, name := range s.order {
		st := Setting{Flag: name, Env: s.byFlag[name], Default: s.builtin[name], Secret: s.secret[name]}
		if st.Secret {
			st.Usage = s.secretUsage[name]
		} else {
			st.Usage = s.fs.Lookup(name).Usage
		}
		out = append(out, st)
	}
	s.fs.VisitAll(func(f *flag.Flag) {
		if _, bound := s.byFlag[f.Name]; !bound {
			out = append(out, Setting{Flag: f.Name, Default: f.DefValue, Usage: f.Usage})
		}
	})
	return out
}

// FlagSet returns the underlying flag set.
func (s *Set) FlagSet() *flag.FlagSet { return s.fs }

func (s *Set) env(name, env string, def any) (string, bool) {
	if _, dup := s.byFlag[name]; !dup {
		s.order = append(s.order, name)
	}
	s.byFlag[name] = env
	s.builtin[name] = format(def)
	v := s.getenv(env)
	return v, v != ""
}

// format writes a default as a user would type it: durations without
// their zero tails ("2m", not "2m0s").
func format(def any) string {
	if d, ok := def.(time.Duration); ok {
		t := d.String()
		if strings.HasSuffix(t, "m0s") {
			t = strings.TrimSuffix(t, "0s")
		}
		if strings.HasSuffix(t, "h0m") {
			t = strings.TrimSuffix(t, "0m")
		}
		return t
	}
	return fmt.Sprint(def)
}

func (s *Set) fail(env string, raw string, err error) {
	s.errs = append(s.errs, refused(env, fmt.Errorf("%s=%q: %v", env, raw, err)))
}

// String binds a string setting.
func (s *Set) String(p *string, name, env, def, usage string) {
	if v, ok := s.env(name, env, def); ok {
		def = v
	}
	s.fs.StringVar(p, name, def, usage)
}

// Secret binds a string setting that comes from the variable env or from
// the file named by ENV_FILE (trailing newlines trimmed). It has no flag:
// a command line shows in ps and in /proc to every user of the host, so
// "-name" on the command line is refused (Parse), naming the variables to
// use instead. name only identifies the setting. Its value is never
// printed.
func (s *Set) Secret(p *string, name, env, usage string) {
	v, _ := s.env(name, env, "")
	s.secret[name] = true
	s.secretUsage[name] = usage
	if path := s.getenv(env + "_FILE"); path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			s.errs = append(s.errs, refused(env+"_FILE", fmt.Errorf("%s_FILE: %v", env, err)))
		} else if v != "" {
			s.errs = append(s.errs, refused(env, fmt.Errorf("%s and %s_FILE are both set; use one", env, env)))
		} else {
			v = strings.TrimRight(string(b), "\r\n")
		}
	}
	*p = v
}

// secretFlags returns an error naming each secret given as a flag in args,
// never its value.
func (s *Set) secretFlags(args []string) error {
	var errs []error
	for _, a := range args {
		if a == "--" {
			break
		}
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if s.secret[name] {
			env := s.byFlag[name]
			errs = append(errs, refused(env, fmt.Errorf("-%s: a secret is not taken from the command line (it shows in ps); set %s or %s_FILE", name, env, env)))
		}
	}
	return errors.Join(errs...)
}

// Int binds an integer setting within [lo, hi].
func (s *Set) Int(p *int, name, env string, def, lo, hi int, usage string) {
	if raw, ok := s.env(name, env, def); ok {
		v, err := strconv.Atoi(strings.TrimSpace(raw))
		if err != nil {
			s.fail(env, raw, errors.New("not an integer"))
		} else {
			def = v
		}
	}
	s.fs.IntVar(p, name, def, usage)
	s.checks = append(s.checks, func() error {
		if *p < lo || *p > hi {
			return refused(env, fmt.Errorf("-%s / %s = %d: must be between %d and %d", name, env, *p, lo, hi))
		}
		return nil
	})
}

// Float binds a float setting within [lo, hi].
func (s *Set) Float(p *float64, name, env string, def, lo, hi float64, usage string) {
	if raw, ok := s.env(name, env, def); ok {
		v, err := strconv.ParseFloat(strings.TrimSpace(raw), 64)
		if err != nil {
			s.fail(env, raw, errors.New("not a number"))
		} else {
			def = v
		}
	}
	s.fs.Float64Var(p, name, def, usage)
	s.checks = append(s.checks, func() error {
		if !(*p >= lo && *p <= hi) {
			return refused(env, fmt.Errorf("-%s / %s = %g: must be between %g and %g", name, env, *p, lo, hi))
		}
		return nil
	})
}

// Duration binds a Go duration setting within [lo, hi].
func (s *Set) Duration(p *time.Duration, name, env string, def, lo, hi time.Duration, usage string) {
	if raw, ok := s.env(name, env, def); ok {
		v, err := time.ParseDuration(strings.TrimSpace(raw))
		if err != nil {
			s.fail(env, raw, errors.New("not a Go duration such as 500ms, 10s or 2m"))
		} else {
			def = v
		}
	}
	s.fs.DurationVar(p, name, def, usage)
	s.checks = append(s.checks, func() error {
		if *p < lo || *p > hi {
			return refused(env, fmt.Errorf("-%s / %s = %s: must be between %s and %s", name, env, *p, lo, hi))
		}
		return nil
	})
}

// Bool binds a boolean setting.
func (s *Set) Bool(p *bool, name, env string, def bool, usage string) {
	if raw, ok := s.env(name, env, def); ok {
		v, err := strconv.ParseBool(strings.TrimSpace(raw))
		if err != nil {
			s.fail(env, raw, errors.New("not a boolean (true or false)"))
		} else {
			def = v
		}
	}
	s.fs.BoolVar(p, name, def, usage)
}

// Enum binds a string setting that must be one of choices.
func (s *Set) Enum(p *string, name, env, def string, choices []string, usage string) {
	s.String(p, name, env, def, usage+" ("+strings.Join(choices, ", ")+")")
	s.checks = append(s.checks, func() error {
		for _, c := range choices {
			if *p == c {
				return nil
			}
		}
		return refused(env, fmt.Errorf("-%s / %s = %q: must be one of %s", name, env, *p, strings.Join(choices, ", ")))
	})
}

// Required marks a string setting that must be non-empty.
func (s *Set) Required(p *string, name string) {
	env := s.byFlag[name]
	what := "-" + name + " / " + env
	if s.secret[name] {
		what = env + " (or " + env + "_FILE)"
	}
	s.checks = append(s.checks, func() error {
		if strings.TrimSpace(*p) == "" {
			return refused(env, fmt.Errorf("%s is required", what))
		}
		return nil
	})
}

// URL checks that a string setting, when set, is an absolute URL with one of
// the schemes.
func (s *Set) URL(p *string, name string, schemes ...string) {
	env := s.byFlag[name]
	s.checks = append(s.checks, func() error {
		if *p == "" {
			return nil
		}
		u, err := url.Parse(*p)
		if err == nil && u.Host != "" {
			for _, sc := range schemes {
				if u.Scheme == sc {
					return nil
				}
			}
		}
		return refused(env, fmt.Errorf("-%s / %s: want an absolute %s URL", name, env, strings.Join(schemes, " or ")))
	})
}

// Check adds a cross-setting check run after parsing.
func (s *Set) Check(fn func() error) { s.checks = append(s.checks, fn) }

// Parse parses args (without the program name) and runs every check. It
// returns flag.ErrHelp for -h. Every other error matches ErrRefused, and
// each refused setting is a *SettingError: errors from environment
// variables are reported together, each naming its variable.
func (s *Set) Parse(args []string) error {
	if err := s.secretFlags(args); err != nil {
		return err
	}
	if err := s.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return refused("", err)
	}
	if len(s.errs) > 0 {
		return errors.Join(s.errs...)
	}
	var errs []error
	for _, c := range s.checks {
		if err := c(); err != nil {
			errs = append(errs, refused("", err))
		}
	}
	return errors.Join(errs...)
}

// Command parses args as Parse does, the way a program's main wants it:
// stop reports that the program must end now with exit status exit, 0
// after -h and 2 after a bad setting, which it prints to the Set's output
// as "<name>: configuration: <error>".
func (s *Set) Command(args []string) (exit int, stop bool) {
	if asksVersion(args) {
		// Before any setting is checked: what is running, even where
		// nothing is configured yet.
		fmt.Fprintf(s.output, "%s %s\n", s.name, Version())
		return 0, true
	}
	err := s.Parse(args)
	switch {
	case err == nil:
		return 0, false
	case errors.Is(err, flag.ErrHelp):
		return 0, true
	}
	fmt.Fprintf(s.output, "%s: configuration: %v\n", s.name, err)
	return 2, true
}

// asksVersion reports whether args hold -version (or --version,
// -version=true) before any "--".
func asksVersion(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-version", "--version", "-version=true", "--version=true":
			return true
		}
	}
	return false
}

// Version describes the running build (internal/build): the module
// version, the VCS revision and time, whether the tree was modified, and
// the Go version.
func Version() string { return build.Read().String() }
