package check

import (
	"os/exec"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// The validator itself: it must pass well-formed objects of every kind
// the chart uses (no false positives from the required-field rule) and
// reject each kind of mistake, or TestChart proves nothing.

const deployment = `
apiVersion: apps/v1
kind: Deployment
metadata:
  name: sendonce-sender
  labels: {app: sender}
spec:
  replicas: 2
  selector:
    matchLabels: {app: sender}
  template:
    metadata:
      labels: {app: sender}
    spec:
      securityContext: {runAsNonRoot: true, runAsUser: 65532}
      containers:
        - name: sender
          image: sendonce:1
          command: [/usr/local/bin/sender]
          env:
            - {name: HTTP_ADDR, value: ":9102"}
            - name: DATABASE_URL
              valueFrom: {secretKeyRef: {name: db, key: url}}
          ports: [{name: http, containerPort: 9102}]
          livenessProbe: {httpGet: {path: /healthz, port: http}}
          readinessProbe: {httpGet: {path: /readyz, port: 9102}}
          resources:
            requests: {cpu: 100m, memory: 64Mi}
            limits: {cpu: "1", memory: 256Mi}
          securityContext:
            readOnlyRootFilesystem: true
            allowPrivilegeEscalation: false
            capabilities: {drop: [ALL]}
`

const scaledObject = `
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata:
  name: sendonce-sender
spec:
  scaleTargetRef: {name: sendonce-sender}
  minReplicaCount: 1
  maxReplicaCount: 10
  triggers:
    - type: nats-jetstream
      metadata:
        natsServerMonitoringEndpoint: nats.nats.svc:8222
        account: "$G"
        stream: SMS
        consumer: senders
        lagThreshold: "100"
`

// wellFormed are objects a cluster accepts; each must pass.
var wellFormed = map[string]string{
	"Deployment":   deployment,
	"ScaledObject": scaledObject,
	"Job": `
apiVersion: batch/v1
kind: Job
metadata: {name: migrate}
spec:
  backoffLimit: 3
  template:
    spec:
      restartPolicy: Never
      containers: [{name: migrate, image: sendonce:1, args: [migrate]}]
`,
	"Service": `
apiVersion: v1
kind: Service
metadata: {name: receiver}
spec:
  selector: {app: receiver}
  ports: [{name: http, port: 80, targetPort: http}]
`,
	"ServiceAccount": `{apiVersion: v1, kind: ServiceAccount, metadata: {name: sa}, automountServiceAccountToken: false}`,
	"ConfigMap":      `{apiVersion: v1, kind: ConfigMap, metadata: {name: cm}, data: {LOG_LEVEL: info}}`,
	"PodDisruptionBudget": `
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: pdb}
spec: {maxUnavailable: 1, selector: {matchLabels: {app: sender}}}
`,
	// podSelector is +optional without omitempty: not required.
	"NetworkPolicy": `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np}
spec:
  policyTypes: [Ingress]
  ingress:
    - from: [{podSelector: {matchLabels: {app: prometheus}}}]
      ports: [{port: 9102, protocol: TCP}]
`,
	"HorizontalPodAutoscaler": `
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: hpa}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: sendonce-sender}
  minReplicas: 1
  maxReplicas: 5
  metrics:
    - type: Resource
      resource: {name: cpu, target: {type: Utilization, averageUtilization: 70}}
`,
	"ServiceMonitor": `
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: sm}
spec:
  selector: {matchLabels: {app: sender}}
  endpoints: [{port: http, path: /metrics, interval: 30s}]
`,
	"PrometheusRule": `
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata: {name: rules}
spec:
  groups:
    - name: g
      rules:
        - alert: A
          expr: up == 0
          for: 5m
          labels: {severity: warning}
          annotations: {summary: "{{ $labels.job }} is down"}
`,
}

func TestValidatorAcceptsWellFormed(t *testing.T) {
	v := newValidator(t)
	for kind, y := range wellFormed {
		o := mustParse(t, y)
		if o.Kind != kind {
			t.Fatalf("fixture %s is a %s", kind, o.Kind)
		}
		if problems := v.Validate(o); len(problems) > 0 {
			t.Errorf("%s: well-formed, but rejected:\n  %s", kind, strings.Join(problems, "\n  "))
		}
	}
}

func TestValidatorRejects(t *testing.T) {
	v := newValidator(t)
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"unknown field", strings.Replace(deployment, "  replicas: 2", "  replicas: 2\n  replica: 3", 1), `unknown field "spec.replica"`},
		{"unknown field, case differs", strings.Replace(deployment, "  replicas: 2", "  Replicas: 2", 1), `unknown field "spec.Replicas"`},
		{"wrong type", strings.Replace(deployment, "replicas: 2", `replicas: "two"`, 1), "cannot unmarshal string into Go struct field DeploymentSpec.spec.replicas of type int32"},
		{"duplicate field", strings.Replace(deployment, `{app: sender}`, `{app: sender, app: x}`, 1), `key "app" already set`},
		{"container without name", strings.Replace(deployment, "- name: sender\n          image", "- image", 1), "spec.template.spec.containers[0].name: required field missing"},
		{"pod without containers", strings.Split(deployment, "      containers:")[0], "spec.template.spec.containers: required field missing"},
		{"env var without name", strings.Replace(deployment, "{name: HTTP_ADDR, value", "{value", 1), "env[0].name: required field missing"},
		{"deployment without spec", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n", "spec: required field missing"},
		{"unknown kind", "apiVersion: apps/v1\nkind: Deploymnet\nmetadata: {name: d}\n", "unknown apiVersion/kind"},
		{"unknown apiVersion", "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n", "unknown apiVersion/kind"},
		{"ScaledObject unknown field", strings.Replace(scaledObject, "  minReplicaCount: 1", "  minReplicas: 1", 1), "spec.minReplicas: unknown field"},
		{"ScaledObject unknown metadata field", strings.Replace(scaledObject, "  name: sendonce-sender\nspec", "  name: sendonce-sender\n  label: {a: b}\nspec", 1), `metadata: unknown field "label"`},
		{"ScaledObject without scaleTargetRef", strings.Replace(scaledObject, "  scaleTargetRef: {name: sendonce-sender}\n", "", 1), "spec.scaleTargetRef: Required value"},
		{"ScaledObject wrong type", strings.Replace(scaledObject, "maxReplicaCount: 10", "maxReplicaCount: ten", 1), "spec.maxReplicaCount: Invalid value"},
		{"ScaledObject CEL rule", strings.Replace(scaledObject, "minReplicaCount: 1", "minReplicaCount: 20", 1), "minReplicaCount must be less than or equal to maxReplicaCount"},
		{"ServiceMonitor unknown field", strings.Replace(wellFormed["ServiceMonitor"], "interval: 30s", "intervall: 30s", 1), `unknown field "spec.endpoints[0].intervall"`},
		{"ServiceMonitor without selector", strings.Replace(wellFormed["ServiceMonitor"], "  selector: {matchLabels: {app: sender}}\n", "", 1), "spec.selector: required field missing"},
		{"PrometheusRule without expr", strings.Replace(wellFormed["PrometheusRule"], "          expr: up == 0\n", "", 1), "expr: required field missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var problems []string
			if o, err := Parse(Doc{Source: "test", YAML: tc.yaml}); err != nil {
				problems = []string{err.Error()}
			} else {
				problems = v.Validate(o)
			}
			if !strings.Contains(strings.Join(problems, "\n"), tc.want) {
				t.Errorf("want a problem with %q, got %q", tc.want, problems)
			}
		})
	}
}

func TestTriggerProblems(t *testing.T) {
	consumers := map[string]string{"senders": "SMS", "senders_urgent": "SMS", "senders_bulk": "SMS"}
	for _, tc := range []struct{ name, from, to, want string }{
		{"ok", "", "", ""},
		{"no stream", "        stream: SMS\n", "", "metadata.stream: missing"},
		{"no account", `        account: "$G"` + "\n", "", "neither account nor accountID"},
		{"accountID will do", "account:", "accountID:", ""},
		{"no endpoint", "        natsServerMonitoringEndpoint: nats.nats.svc:8222\n", "", "natsServerMonitoringEndpoint: missing"},
		{"unknown consumer", "consumer: senders", "consumer: sender", `"sender" is none of`},
		{"wrong stream", "stream: SMS", "stream: SMS_DLQ", `consumer "senders" is on stream "SMS"`},
		{"lag not a number", `lagThreshold: "100"`, `lagThreshold: "many"`, "is not an integer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := mustParse(t, strings.Replace(scaledObject, tc.from, tc.to, 1))
			got := strings.Join(TriggerProblems(o.Raw, consumers), "\n")
			if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestProgram(t *testing.T) {
	for _, tc := range []struct {
		cmd, args []string
		want      string
	}{
		{nil, nil, "relay"},
		{nil, []string{"-log-level", "debug"}, "relay"},
		{nil, []string{"migrate"}, "relay migrate"},
		{[]string{"/usr/local/bin/relay"}, []string{"console"}, "relay console"},
		{[]string{"/usr/local/bin/relay", "console"}, nil, "relay console"},
		{[]string{"/usr/local/bin/sender"}, nil, "sender"},
		{[]string{"/usr/local/bin/receiver"}, []string{"-log-level", "info"}, "receiver"},
		{[]string{"/bin/sh", "-c", "relay"}, nil, ""},
	} {
		got, err := Program(corev1.Container{Command: tc.cmd, Args: tc.args})
		if got != tc.want || (err == nil) != (tc.want != "") {
			t.Errorf("Program(%q, %q) = %q, %v; want %q", tc.cmd, tc.args, got, err, tc.want)
		}
	}
}

func TestChecksOnAWorkload(t *testing.T) {
	v := newValidator(t)
	repo := loadRepo(t)
	o := mustParse(t, deployment)
	if p := v.Validate(o); len(p) > 0 {
		t.Fatal(p)
	}
	w := Workloads([]*Object{o})[0]
	c := w.Pod.Containers[0]
	if p := SecurityProblems(w); len(p) > 0 {
		t.Errorf("secure workload rejected: %q", p)
	}
	if p := ProbeProblems(c, Env(c, nil)); len(p) > 0 {
		t.Errorf("right probes rejected: %q", p)
	}
	if p := EnvProblems("sender", Env(c, nil), repo.settings); len(p) > 0 {
		t.Errorf("sender's settings rejected: %q", p)
	}
	if p := EnvProblems("receiver", map[string]EnvVar{"SENDER_CONCURRENCY": {From: "env"}}, repo.settings); len(p) != 1 {
		t.Errorf("a sender setting on the receiver: got %q, want one problem", p)
	}

	// Each rule broken once.
	bad := mustParse(t, strings.NewReplacer(
		"runAsNonRoot: true", "runAsNonRoot: false",
		"readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false",
		"drop: [ALL]", "drop: [NET_RAW]",
		"limits: {cpu: \"1\", memory: 256Mi}", "limits: {memory: 256Mi}",
		"path: /readyz", "path: /ready",
		`value: ":9102"`, `value: ":9103"`,
	).Replace(deployment))
	if p := v.Validate(bad); len(p) > 0 {
		t.Fatal(p)
	}
	w = Workloads([]*Object{bad})[0]
	c = w.Pod.Containers[0]
	got := strings.Join(append(SecurityProblems(w), ProbeProblems(c, Env(c, nil))...), "\n")
	for _, want := range []string{"runAsNonRoot", "readOnlyRootFilesystem", "capabilities.drop", "resources.limits.cpu",
		`readinessProbe.httpGet.path is "/ready"`, "livenessProbe.httpGet.port is http, want HTTP_ADDR's port 9103"} {
		if !strings.Contains(got, want) {
			t.Errorf("no problem about %s in:\n%s", want, got)
		}
	}
}

func TestRepoFacts(t *testing.T) {
	repo := loadRepo(t)
	for prog, vars := range map[string][]string{
		"relay":         {"DATABASE_URL", "DATABASE_URL_FILE", "HTTP_ADDR", "RELAY_BATCH_SIZE"},
		"relay migrate": {"DATABASE_URL", "DATABASE_DIRECT_URL_FILE"},
		"relay console": {"CONSOLE_ADDR", "NATS_URL"},
		"sender":        {"SENDER_CONCURRENCY", "SMS_API_KEY_FILE", "HTTP_ADDR"},
		"receiver":      {"RECEIPTS_ADDR", "SMS_WEBHOOK_SECRET_FILE", "HTTP_ADDR"},
	} {
		for _, name := range vars {
			if !repo.settings[prog][name] {
				t.Errorf("docs/configuration.md: %s has no %s (the parser is wrong, or the docs changed)", prog, name)
			}
		}
	}
	if repo.settings["receiver"]["SENDER_CONCURRENCY"] {
		t.Error("the receiver's table ran into the sender's")
	}
	want := map[string]string{"senders": "SMS", "senders_urgent": "SMS", "senders_bulk": "SMS"}
	for c, s := range want {
		if repo.consumers[c] != s {
			t.Errorf("nats/: consumer %s on %q, want %s", c, repo.consumers[c], s)
		}
	}
	if len(repo.alerts.Groups) == 0 {
		t.Error("alerts.yml: no groups")
	}
	if p := RuleDiff(repo.alerts, repo.alerts); len(p) > 0 {
		t.Errorf("alerts.yml differs from itself: %q", p)
	}
}

// The chart is rendered for the Kubernetes release whose API types it is
// validated against.
func TestKubeVersionMatchesModules(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "k8s.io/api").Output()
	if err != nil {
		t.Fatal(err)
	}
	api := strings.TrimSpace(string(out)) // v0.37.2 is Kubernetes 1.37.2
	kv := strings.Split(strings.TrimPrefix(KubeVersion, "v"), ".")
	if want := "v0." + kv[1] + "."; !strings.HasPrefix(api, want) {
		t.Errorf("KubeVersion %s, but go.mod has k8s.io/api %s: keep them one release", KubeVersion, api)
	}
}

func TestSplit(t *testing.T) {
	docs := Split("---\n# Source: c/templates/a.yaml\na: 1\n---\n# Source: c/templates/empty.yaml\n\n---\nb: 2\n--- # x\nc: 3\n")
	if len(docs) != 3 || docs[0].Source != "c/templates/a.yaml" || docs[2].YAML != "\nc: 3\n" {
		t.Errorf("Split: %+v", docs)
	}
}

func mustParse(t *testing.T, y string) *Object {
	t.Helper()
	o, err := Parse(Doc{Source: "test", YAML: y})
	if err != nil {
		t.Fatal(err)
	}
	return o
}
