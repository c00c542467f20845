package check

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	release "helm.sh/helm/v4/pkg/release/v1"
)

// Release and namespace the chart is rendered for.
const (
	ReleaseName = "sendonce"
	Namespace   = "sendonce"
)

// KubeVersion is the cluster version rendered for: the release of the
// k8s.io modules the objects are validated against (go.mod; a test keeps
// the two together). `helm template` takes its default from the
// client-go it was built with; Helm's SDK in a test binary says v1.20.
const KubeVersion = "v1.37.0"

func kubeVersion() *common.KubeVersion {
	kv, err := common.ParseKubeVersion(KubeVersion)
	if err != nil {
		panic(err)
	}
	return kv
}

// CRDAPIs are what a cluster with KEDA and the prometheus-operator announces:
// each group/version and each group/version/kind, as Helm's discovery of a
// real cluster fills .Capabilities.APIVersions (a chart may ask for either).
var CRDAPIs = []string{
	"keda.sh/v1alpha1", "keda.sh/v1alpha1/ScaledObject", "keda.sh/v1alpha1/TriggerAuthentication",
	"monitoring.coreos.com/v1", "monitoring.coreos.com/v1/ServiceMonitor",
	"monitoring.coreos.com/v1/PodMonitor", "monitoring.coreos.com/v1/PrometheusRule",
}

// ValueSet is one way the chart is installed: its values, and whether the
// cluster has the KEDA and prometheus-operator CRDs.
type ValueSet struct {
	Name    string // "default" or the file name under ci/
	File    string // "" for the chart's own values.yaml alone
	WithCRD bool
}

// ValueSets are the chart's defaults and each ci/*-values.yaml. A set whose
// file name says "no-keda" is rendered for a cluster without the CRDs, so
// that the chart's fallbacks (an HPA instead of a ScaledObject, say) render.
func ValueSets(chartDir string) ([]ValueSet, error) {
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	sets := []ValueSet{{Name: "default", WithCRD: true}}
	for _, f := range files {
		name := filepath.Base(f)
		sets = append(sets, ValueSet{Name: name, File: f, WithCRD: !strings.Contains(name, "no-keda")})
	}
	return sets, nil
}

// Values reads the set's values file (none for the default set).
func (vs ValueSet) Values() (map[string]any, error) {
	if vs.File == "" {
		return map[string]any{}, nil
	}
	return common.ReadValuesFile(vs.File)
}

// Doc is one YAML document Helm rendered.
type Doc struct {
	Source string // the template it came from ("# Source:" line)
	YAML   string
}

// Render renders the chart as `helm template` does (client-side dry-run
// install), hooks included, and splits the output into documents.
func Render(chartDir string, vs ValueSet) ([]Doc, error) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return nil, fmt.Errorf("load chart: %w", err)
	}
	vals, err := vs.Values()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", vs.File, err)
	}
	cfg := action.NewConfiguration(action.ConfigurationSetLogger(slog.DiscardHandler))
	install := action.NewInstall(cfg)
	install.DryRunStrategy = action.DryRunClient
	install.ReleaseName = ReleaseName
	install.Namespace = Namespace
	install.Replace = true // no release store to ask whether the name is taken
	install.KubeVersion = kubeVersion()
	if vs.WithCRD {
		install.APIVersions = common.VersionSet(CRDAPIs)
	}
	r, err := install.RunWithContext(context.Background(), ch, vals)
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	rel, ok := r.(*release.Release)
	if !ok {
		return nil, fmt.Errorf("render: unexpected release type %T", r)
	}
	docs := Split(rel.Manifest)
	for _, h := range rel.Hooks {
		for _, d := range Split(h.Manifest) {
			if d.Source == "" {
				d.Source = h.Path
			}
			docs = append(docs, d)
		}
	}
	return docs, nil
}

var (
	docSep     = regexp.MustCompile(`(?m)^---[ \t]*(#.*)?$`)
	sourceLine = regexp.MustCompile(`(?m)^# Source: (.+)$`)
)

// Split cuts a multi-document YAML stream into its documents, dropping
// those with nothing but comments and blank lines.
func Split(manifest string) []Doc {
	var docs []Doc
	for _, part := range docSep.Split(manifest, -1) {
		empty := true
		for _, line := range strings.Split(part, "\n") {
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
				empty = false
				break
			}
		}
		if empty {
			continue
		}
		d := Doc{YAML: part}
		if m := sourceLine.FindStringSubmatch(part); m != nil {
			d.Source = strings.TrimSpace(m[1])
		}
		docs = append(docs, d)
	}
	return docs
}

// Lint runs Helm's chart linter, strict (warnings count), on the chart
// with the set's values, and returns what it found at warning level or
// above.
func Lint(chartDir string, vs ValueSet) ([]string, error) {
	vals, err := vs.Values()
	if err != nil {
		return nil, err
	}
	l := action.NewLint()
	l.Strict = true
	l.Namespace = Namespace
	l.KubeVersion = kubeVersion()
	res := l.Run([]string{chartDir}, vals)
	var out []string
	for _, m := range res.Messages {
		if m.Severity >= support.WarningSev {
			out = append(out, m.Error()) // "[ERROR] templates/x.yaml: ..."
		}
	}
	if res.TotalChartsLinted == 0 { // the chart could not be linted at all
		for _, err := range res.Errors {
			out = append(out, err.Error())
		}
	}
	return out, nil
}

// ChartDir is the chart under test: deploy/helm/sendonce beside this
// module, or $SENDONCE_CHART (to check a copy, or another chart).
func ChartDir() string {
	if d := os.Getenv("SENDONCE_CHART"); d != "" {
		return d
	}
	return filepath.Join("..", "sendonce")
}
