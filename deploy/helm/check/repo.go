package check

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"sigs.k8s.io/yaml"
)

// Facts of the repository the chart must agree with.

// RepoRoot is the repository's root, three levels above this module.
func RepoRoot() string { return filepath.Join("..", "..", "..") }

var (
	heading  = regexp.MustCompile(`^#{2,3} (.+)$`)
	backtick = regexp.MustCompile("`([A-Z][A-Z0-9_]*)`")
)

// Settings reads docs/configuration.md: for each section ("relay",
// "relay migrate", "sender", ...), the environment variables of its
// settings table. A row's first cell names one ("`NATS_URL`") or two
// ("`DATABASE_URL` or `DATABASE_URL_FILE`"); a flag-only row names none.
func Settings(path string) (map[string]map[string]bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]map[string]bool{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if m := heading.FindStringSubmatch(line); m != nil {
			section = strings.TrimSpace(m[1])
			continue
		}
		if section == "" || !strings.HasPrefix(line, "|") {
			continue
		}
		cells := strings.Split(line, "|")
		if len(cells) < 3 {
			continue
		}
		for _, m := range backtick.FindAllStringSubmatch(cells[1], -1) {
			if out[section] == nil {
				out[section] = map[string]bool{}
			}
			out[section][m[1]] = true
		}
	}
	return out, sc.Err()
}

// Consumers reads nats/: each durable consumer (SMS.<durable>.consumer.json)
// with the stream it belongs to, whose own file (SMS.stream.json) must
// name it.
func Consumers(natsDir string) (map[string]string, error) {
	files, err := filepath.Glob(filepath.Join(natsDir, "*.consumer.json"))
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, f := range files {
		var c struct {
			Durable string `json:"durable_name"`
		}
		if err := readJSON(f, &c); err != nil {
			return nil, err
		}
		streamFile := strings.SplitN(filepath.Base(f), ".", 2)[0] + ".stream.json"
		var s struct {
			Name string `json:"name"`
		}
		if err := readJSON(filepath.Join(natsDir, streamFile), &s); err != nil {
			return nil, err
		}
		if c.Durable == "" || s.Name == "" {
			return nil, fmt.Errorf("%s: no durable_name, or %s no name", f, streamFile)
		}
		out[c.Durable] = s.Name
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no *.consumer.json", natsDir)
	}
	return out, nil
}

func readJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// Health paths the probes use, as internal/telemetry serves them.
const (
	LivenessPath  = "/healthz"
	ReadinessPath = "/readyz"
)

// ServesHealth says whether telemetry.go still registers both paths.
func ServesHealth(telemetryGo string) error {
	src, err := os.ReadFile(telemetryGo)
	if err != nil {
		return err
	}
	for _, p := range []string{LivenessPath, ReadinessPath} {
		if !strings.Contains(string(src), `"GET `+p+`"`) {
			return fmt.Errorf("%s does not register \"GET %s\"", telemetryGo, p)
		}
	}
	return nil
}

// Alerts reads deploy/prometheus/alerts.yml as a PrometheusRule's spec:
// the two share Prometheus's rule-file format.
func Alerts(path string) (*monitoringv1.PrometheusRuleSpec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var spec monitoringv1.PrometheusRuleSpec
	if err := yaml.UnmarshalStrict(data, &spec); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &spec, nil
}

// KEDA's published CRDs are read from its module, at the release the
// chart targets; the sum pins the bytes as go.sum would.
const (
	KedaModule  = "github.com/kedacore/keda/v2"
	KedaVersion = "v2.20.2"
	kedaSum     = "h1:SR60v8uIcelbveS8n/1jcl8tLdBBIbHMxmdOHw8tKqA="
)

// KedaDir downloads KEDA's module (or finds it in the module cache) with
// the go command, without making it a requirement of this module: its
// Go packages would pull in a Kubernetes release of their own.
func KedaDir() (string, error) {
	cmd := exec.Command("go", "mod", "download", "-json", KedaModule+"@"+KedaVersion)
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		return "", fmt.Errorf("go mod download %s@%s: %w", KedaModule, KedaVersion, err)
	}
	var m struct{ Dir, Sum, Error string }
	if err := json.Unmarshal(out, &m); err != nil {
		return "", err
	}
	if m.Error != "" {
		return "", fmt.Errorf("go mod download %s@%s: %s", KedaModule, KedaVersion, m.Error)
	}
	if m.Sum != kedaSum {
		return "", fmt.Errorf("%s@%s: checksum %s, want %s", KedaModule, KedaVersion, m.Sum, kedaSum)
	}
	return m.Dir, nil
}
