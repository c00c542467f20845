package check

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
)

// The chart, rendered for each value set as `helm template` would, and
// every object checked: its schema, its security, and its agreement with
// the programs' settings, nats/ and the alerting rules.

var (
	validatorOnce sync.Once
	validator     *Validator
	validatorErr  error
)

func newValidator(t *testing.T) *Validator {
	t.Helper()
	validatorOnce.Do(func() {
		dir, err := KedaDir()
		if err != nil {
			validatorErr = err
			return
		}
		validator, validatorErr = NewValidator(KedaScaledObjectCRD(dir))
	})
	if validatorErr != nil {
		t.Fatal(validatorErr)
	}
	return validator
}

type repoFacts struct {
	settings  map[string]map[string]bool
	consumers map[string]string
	alerts    *monitoringv1.PrometheusRuleSpec
}

func loadRepo(t *testing.T) repoFacts {
	t.Helper()
	root := RepoRoot()
	settings, err := Settings(filepath.Join(root, "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	// The OpenTelemetry variables the relay, the sender and the receiver
	// read (the SDK's, not their flags): docs/observability.md lists them.
	otel, err := Settings(filepath.Join(root, "docs", "observability.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(otel["Turning it on"]) == 0 {
		t.Fatal(`docs/observability.md: no variables under "Turning it on"`)
	}
	for _, program := range []string{"relay", "sender", "receiver"} {
		for name := range otel["Turning it on"] {
			settings[program][name] = true
		}
	}
	consumers, err := Consumers(filepath.Join(root, "nats"))
	if err != nil {
		t.Fatal(err)
	}
	alerts, err := Alerts(filepath.Join(root, "deploy", "prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := ServesHealth(filepath.Join(root, "internal", "telemetry", "telemetry.go")); err != nil {
		t.Fatal(err)
	}
	return repoFacts{settings, consumers, alerts}
}

func TestChart(t *testing.T) {
	chart := ChartDir()
	if _, err := os.Stat(filepath.Join(chart, "Chart.yaml")); err != nil {
		t.Fatalf("no chart to check at %s: %v", chart, err)
	}
	v := newValidator(t)
	repo := loadRepo(t)
	sets, err := ValueSets(chart)
	if err != nil {
		t.Fatal(err)
	}
	for _, set := range sets {
		t.Run(set.Name, func(t *testing.T) {
			t.Run("lint", func(t *testing.T) {
				msgs, err := Lint(chart, set)
				if err != nil {
					t.Fatalf("[%s] helm lint: %v", set.Name, err)
				}
				for _, m := range msgs {
					t.Errorf("[%s] helm lint --strict: %s", set.Name, m)
				}
			})
			docs, err := Render(chart, set)
			if err != nil {
				t.Fatalf("[%s] helm template (capabilities with KEDA and prometheus-operator: %v): %v", set.Name, set.WithCRD, err)
			}
			objs := checkSchemas(t, set, v, docs)
			t.Logf("[%s] %d objects: %s", set.Name, len(objs), summary(objs))
			checkCapabilities(t, set, objs)
			checkNoSecrets(t, set, objs)
			checkSecurity(t, set, objs)
			checkSettings(t, set, objs, repo)
			checkScaling(t, set, objs, repo)
			checkRules(t, set, objs, repo)
		})
	}
}

// report fails the test with one line per problem, naming the value
// set, the object, its template and the field.
func report(t *testing.T, set ValueSet, o *Object, problems ...string) {
	t.Helper()
	for _, p := range problems {
		t.Errorf("[%s] %s (%s): %s", set.Name, o, o.Source, p)
	}
}

func checkSchemas(t *testing.T, set ValueSet, v *Validator, docs []Doc) []*Object {
	t.Helper()
	var objs []*Object
	seen := map[string]string{}
	for _, d := range docs {
		o, err := Parse(d)
		if err != nil {
			t.Errorf("[%s] %v", set.Name, err)
			continue
		}
		report(t, set, o, v.Validate(o)...)
		key := o.APIVersion + " " + o.String()
		if prev, dup := seen[key]; dup {
			report(t, set, o, "rendered twice (also by "+prev+"): the second would overwrite the first")
		}
		seen[key] = o.Source
		objs = append(objs, o)
	}
	if len(objs) == 0 {
		t.Errorf("[%s] the chart renders nothing", set.Name)
	}
	return objs
}

// checkCapabilities: on a cluster without the CRDs, an object of theirs
// would fail the whole install; the chart must fall back instead.
func checkCapabilities(t *testing.T, set ValueSet, objs []*Object) {
	t.Helper()
	if set.WithCRD {
		return
	}
	for _, o := range objs {
		if strings.HasPrefix(o.APIVersion, "keda.sh/") || strings.HasPrefix(o.APIVersion, "monitoring.coreos.com/") {
			report(t, set, o, fmt.Sprintf("rendered although the cluster does not serve %s (no KEDA / prometheus-operator CRDs)", o.APIVersion))
		}
	}
}

// checkNoSecrets: the chart takes credentials from existing Secrets
// only; a Secret it rendered would carry a value from values.yaml.
func checkNoSecrets(t *testing.T, set ValueSet, objs []*Object) {
	t.Helper()
	for _, o := range objs {
		if o.Kind == "Secret" {
			report(t, set, o, "the chart renders a Secret: credentials must come from existing Secrets (secretKeyRef, volumes), never from values")
		}
	}
}

func checkSecurity(t *testing.T, set ValueSet, objs []*Object) {
	t.Helper()
	for _, w := range Workloads(objs) {
		report(t, set, w.Obj, SecurityProblems(w)...)
	}
}

// checkSettings: every variable a container sets is a setting of the
// program it runs, and its probes ask that program's /healthz and
// /readyz on HTTP_ADDR's port.
func checkSettings(t *testing.T, set ValueSet, objs []*Object, repo repoFacts) {
	t.Helper()
	configMaps := map[string]*corev1.ConfigMap{}
	for _, o := range objs {
		if cm, ok := o.Typed.(*corev1.ConfigMap); ok {
			configMaps[cm.Name] = cm
		}
	}
	for _, w := range Workloads(objs) {
		for kind, cs := range map[string][]corev1.Container{"initContainer": w.Pod.InitContainers, "container": w.Pod.Containers} {
			for _, c := range cs {
				where := fmt.Sprintf("%s %q: ", kind, c.Name)
				prog, err := Program(c)
				if err != nil {
					report(t, set, w.Obj, where+err.Error())
					continue
				}
				env := Env(c, configMaps)
				for _, p := range EnvProblems(prog, env, repo.settings) {
					report(t, set, w.Obj, where+p)
				}
				if kind == "container" && w.LongRunning && repo.settings[prog]["HTTP_ADDR"] {
					for _, p := range ProbeProblems(c, env) {
						report(t, set, w.Obj, where+p)
					}
				}
			}
		}
	}
}

// checkScaling: every ScaledObject and HPA scales a Deployment the chart
// renders; KEDA's nats-jetstream triggers name nats/'s stream and
// consumers and carry what the scaler needs, and every consumer (lane)
// has one: a lane without would back up while KEDA saw no lag.
func checkScaling(t *testing.T, set ValueSet, objs []*Object, repo repoFacts) {
	t.Helper()
	deployments := map[string]*appsv1.Deployment{}
	for _, o := range objs {
		if d, ok := o.Typed.(*appsv1.Deployment); ok {
			deployments[d.Name] = d
		}
	}
	target := func(o *Object, kind, name string) {
		if kind != "" && kind != "Deployment" {
			report(t, set, o, fmt.Sprintf("scaleTargetRef.kind %q: the chart's workloads are Deployments", kind))
		} else if deployments[name] == nil {
			report(t, set, o, fmt.Sprintf("scaleTargetRef.name %q: no such Deployment rendered", name))
		}
	}
	for _, o := range objs {
		switch {
		case o.Kind == "ScaledObject":
			spec, _ := o.Raw["spec"].(map[string]any)
			ref, _ := spec["scaleTargetRef"].(map[string]any)
			kind, _ := ref["kind"].(string)
			name, _ := ref["name"].(string)
			target(o, kind, name)
			report(t, set, o, TriggerProblems(o.Raw, repo.consumers)...)
			if lanes := natsConsumers(o.Raw); len(lanes) > 0 {
				for c := range repo.consumers {
					if !lanes[c] {
						report(t, set, o, fmt.Sprintf("spec.triggers: no nats-jetstream trigger for consumer %q (nats/)", c))
					}
				}
			}
		case reflect.TypeOf(o.Typed) == reflect.TypeFor[*autoscalingv2.HorizontalPodAutoscaler]():
			h := o.Typed.(*autoscalingv2.HorizontalPodAutoscaler)
			target(o, h.Spec.ScaleTargetRef.Kind, h.Spec.ScaleTargetRef.Name)
		}
	}
}

// checkRules: a PrometheusRule the chart renders holds exactly the
// groups and rules of deploy/prometheus/alerts.yml.
func checkRules(t *testing.T, set ValueSet, objs []*Object, repo repoFacts) {
	t.Helper()
	for _, o := range objs {
		pr, ok := o.Typed.(*monitoringv1.PrometheusRule)
		if !ok {
			continue
		}
		report(t, set, o, RuleDiff(repo.alerts, &pr.Spec)...)
	}
}

// natsConsumers are the consumers a ScaledObject's nats-jetstream
// triggers watch.
func natsConsumers(raw map[string]any) map[string]bool {
	out := map[string]bool{}
	spec, _ := raw["spec"].(map[string]any)
	triggers, _ := spec["triggers"].([]any)
	for _, t := range triggers {
		trig, _ := t.(map[string]any)
		md, _ := trig["metadata"].(map[string]any)
		if c, ok := md["consumer"].(string); ok && trig["type"] == "nats-jetstream" {
			out[c] = true
		}
	}
	return out
}

func summary(objs []*Object) string {
	n := map[string]int{}
	var kinds []string
	for _, o := range objs {
		if n[o.Kind] == 0 {
			kinds = append(kinds, o.Kind)
		}
		n[o.Kind]++
	}
	var parts []string
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%d %s", n[k], k))
	}
	return strings.Join(parts, ", ")
}
