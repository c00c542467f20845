package sendonce_test

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// composeFile is the part of docker-compose.yml the checks read.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Secrets  map[string]struct {
		File string `yaml:"file"`
	} `yaml:"secrets"`
}

type composeService struct {
	Image       string            `yaml:"image"`
	Build       any               `yaml:"build"`
	Environment map[string]string `yaml:"environment"`
	Ports       []any             `yaml:"ports"`
	Secrets     []any             `yaml:"secrets"`
	Entrypoint  []string          `yaml:"entrypoint"`
	Command     []string          `yaml:"command"`
}

func loadCompose(t *testing.T, path string) composeFile {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c
}

// secretNames are the compose secrets a service mounts.
func (s composeService) secretNames() []string {
	var out []string
	for _, x := range s.Secrets {
		switch v := x.(type) {
		case string:
			out = append(out, v)
		case map[string]any:
			out = append(out, fmt.Sprint(v["source"]))
		}
	}
	return out
}

// target is the Dockerfile stage a service builds ("" without a target,
// which is the last stage).
func (s composeService) target() (string, bool) {
	switch b := s.Build.(type) {
	case nil:
		return "", false
	case map[string]any:
		t, _ := b["target"].(string)
		return t, true
	}
	return "", true
}

var (
	// A setting that holds a secret itself: it must come from its _FILE.
	secretSetting = regexp.MustCompile(`(PASSWORD|SECRET|TOKEN|API_KEY|AUTH|DATABASE_URL)`)
	// A URL with credentials in it.
	credentialURL = regexp.MustCompile(`://[^/@\s]*:[^/@\s]*@`)
)

// The owner's DSN, the owner's password and the NATS admin password, and
// the only services that may have each.
var privileged = map[string][]string{
	"owner_database_url":  {"migrate"},
	"pg_owner_password":   {"postgres", "db-logins"},
	"nats_admin_password": {"nats", "nats-1", "nats-2", "nats-3", "nats-setup", "nats-setup-cluster"},
	"nats_route_password": {"nats-1", "nats-2", "nats-3"},
	"nats_route_key":      {"nats-1", "nats-2", "nats-3"},
}

// routeSecrets are what a node running deploy/nats/cluster.conf needs for
// its routes (run.sh reads them).
var routeSecrets = []string{"nats_route_password", "nats_route_ca", "nats_route_cert", "nats_route_key"}

// The runtime processes, the login each connects to Postgres with (a role
// IN ROLE sendonce_<role>, deploy/postgres/logins.sh) and its NATS user.
var runtimeLogins = map[string]struct{ dsn, natsUser string }{
	"relay":          {"relay_database_url", "relay"},
	"relay-cluster":  {"relay_database_url", "relay"},
	"sender":         {"sender_database_url", "sender"},
	"sender-cluster": {"sender_database_url", "sender"},
	"receiver":       {"receiver_database_url", ""},
}

// checkCompose returns what makes a compose file unsafe to copy: a port
// published beyond the loopback, a secret in the environment, a runtime
// process with the owner's login or another's, a NATS process that may
// change the topology, the provider stub in the production image.
func checkCompose(c composeFile, dockerfile string) []string {
	var bad []string
	add := func(f string, a ...any) { bad = append(bad, fmt.Sprintf(f, a...)) }
	prodTarget := ""
	for name, s := range c.Services {
		for _, p := range s.Ports {
			switch v := p.(type) {
			case string:
				if !strings.HasPrefix(v, "127.0.0.1:") {
					add("%s publishes %q beyond the loopback: bind it to 127.0.0.1", name, v)
				}
			case map[string]any:
				if v["host_ip"] != "127.0.0.1" {
					add("%s publishes port %v without host_ip 127.0.0.1", name, v["target"])
				}
			default:
				add("%s publishes %v beyond the loopback", name, v)
			}
		}
		mounted := s.secretNames()
		for k, v := range s.Environment {
			if credentialURL.MatchString(v) {
				add("%s: %s holds a URL with credentials: use %s_FILE and a secret", name, k, k)
			}
			if strings.HasSuffix(k, "_FILE") {
				secret, found := strings.CutPrefix(v, "/run/secrets/")
				if !found || !slices.Contains(mounted, secret) {
					add("%s: %s=%s is not one of its compose secrets", name, k, v)
				}
				continue
			}
			if secretSetting.MatchString(k) && v != "" && k != "SMS_API_ALLOW_INSECURE" {
				add("%s: %s is set in the environment: use %s_FILE and a compose secret", name, k, k)
			}
		}
		for _, sec := range mounted {
			if _, ok := c.Secrets[sec]; !ok {
				add("%s mounts secret %s, which the file does not define", name, sec)
			}
			if who, ok := privileged[sec]; ok && !slices.Contains(who, name) {
				add("%s gets %s, which only %s may have", name, sec, strings.Join(who, ", "))
			}
		}
		if slices.ContainsFunc(s.Command, func(a string) bool { return strings.HasSuffix(a, "cluster.conf") }) {
			for _, sec := range routeSecrets {
				if !slices.Contains(mounted, sec) {
					add("%s runs cluster.conf without the secret %s: its routes need a password and TLS", name, sec)
				}
			}
		}
		if want, ok := runtimeLogins[name]; ok {
			if got := s.Environment["DATABASE_URL_FILE"]; got != "/run/secrets/"+want.dsn {
				add("%s connects to Postgres with %q, want its own login /run/secrets/%s", name, got, want.dsn)
			}
			if want.natsUser != "" {
				env := s.Environment
				if env["NATS_USER"] != want.natsUser || env["NATS_PASSWORD_FILE"] != "/run/secrets/nats_"+want.natsUser+"_password" {
					add("%s connects to NATS as %q, want user %s with its password file", name, env["NATS_USER"], want.natsUser)
				}
				if env["NATS_INBOX_PREFIX"] != "_INBOX_"+want.natsUser {
					add("%s: NATS_INBOX_PREFIX=%q, want _INBOX_%s", name, env["NATS_INBOX_PREFIX"], want.natsUser)
				}
				if env["NATS_ENSURE_TOPOLOGY"] != "false" {
					add("%s ensures the NATS topology itself: run relay setup, and NATS_ENSURE_TOPOLOGY=false", name)
				}
			}
			if t, _ := s.target(); prodTarget == "" {
				prodTarget = t
			}
		}
	}
	if prodTarget == "" {
		add("the runtime services build no named Dockerfile target: the stub would share their image")
	}
	stub, ok := c.Services["smsstub"]
	if !ok {
		return bad
	}
	if t, builds := stub.target(); builds && (t == "" || t == prodTarget) {
		add("smsstub builds the production image (target %q): give it its own target", t)
	}
	if strings.Contains(strings.Join(stub.Entrypoint, " "), "/usr/local/bin/relay") {
		add("smsstub runs a production binary")
	}
	if prodTarget != "" && stageBuildsStub(dockerfile, prodTarget) {
		add("the Dockerfile's %s stage holds the provider stub", prodTarget)
	}
	return bad
}

// stageBuildsStub reports whether the Dockerfile stage named target holds
// smsstub: it names it, or copies a directory a RUN line builds it into.
func stageBuildsStub(dockerfile, target string) bool {
	var stage []string
	in := false
	for _, line := range strings.Split(dockerfile, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && strings.EqualFold(f[0], "FROM") {
			in = len(f) >= 4 && strings.EqualFold(f[2], "AS") && f[3] == target
			continue
		}
		if in {
			stage = append(stage, line)
		}
	}
	for _, line := range stage {
		if strings.Contains(line, "smsstub") {
			return true
		}
		f := strings.Fields(line)
		if len(f) >= 3 && strings.EqualFold(f[0], "COPY") && strings.HasPrefix(f[1], "--from=") {
			src := f[2]
			for _, run := range strings.Split(dockerfile, "\n") {
				if strings.Contains(run, "-o "+src) && strings.Contains(run, "smsstub") {
					return true
				}
			}
		}
	}
	return false
}

// docker-compose.yml is what a user copies: no port beyond the loopback,
// no secret in it, each runtime process with its own least-privilege
// logins (the owner's DSN for migrate only), and the stub in its own image.
func TestComposeIsSafeByDefault(t *testing.T) {
	t.Parallel()
	df, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	c := loadCompose(t, "docker-compose.yml")
	for _, name := range []string{"relay", "sender", "receiver", "migrate", "smsstub", "relay-cluster", "sender-cluster"} {
		if _, ok := c.Services[name]; !ok {
			t.Fatalf("docker-compose.yml has no service %s", name)
		}
	}
	for _, problem := range checkCompose(c, string(df)) {
		t.Error(problem)
	}
}

// The check finds each unsafe shape (so that a pass above means something).
func TestComposeCheckFindsTheUnsafe(t *testing.T) {
	t.Parallel()
	const unsafe = `
services:
  postgres:
    environment: {POSTGRES_PASSWORD: sendonce}
    ports: ["5432:5432", "0.0.0.0:8222:8222"]
  migrate:
    build: .
    environment: {DATABASE_URL: "postgres://sendonce:sendonce@postgres/sendonce"}
  relay:
    build: .
    environment: {DATABASE_URL_FILE: /run/secrets/owner_database_url, NATS_USER: admin}
    secrets: [owner_database_url]
  smsstub:
    build: .
    environment: {SMS_API_KEY: dev-api-key}
  nats-1:
    command: ["-c", "/etc/nats/cluster.conf"]
    secrets: [nats_route_password]
secrets:
  nats_route_password: {file: ./secrets/nats_route_password}
  owner_database_url: {file: ./secrets/owner_database_url}
`
	var c composeFile
	if err := yaml.Unmarshal([]byte(unsafe), &c); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(checkCompose(c, "FROM x AS build\nRUN go build -o /out/ ./cmd/relay ./cmd/smsstub\nFROM y\nCOPY --from=build /out/ /usr/local/bin/\n"), "\n")
	for _, want := range []string{
		`postgres publishes "5432:5432"`, `postgres publishes "0.0.0.0:8222:8222"`,
		"postgres: POSTGRES_PASSWORD is set", "migrate: DATABASE_URL holds a URL with credentials",
		"relay gets owner_database_url", "relay connects to Postgres with", "relay connects to NATS as",
		"relay ensures the NATS topology", "smsstub: SMS_API_KEY is set", "no named Dockerfile target",
		"nats-1 runs cluster.conf without the secret nats_route_key",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the check misses %q; it said:\n%s", want, got)
		}
	}
}
