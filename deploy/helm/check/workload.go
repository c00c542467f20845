package check

import (
	"fmt"
	"net"
	"path"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Workload is a pod template the chart renders.
type Workload struct {
	Obj *Object
	Pod *corev1.PodSpec
	// LongRunning pods serve until stopped (a Deployment's); a Job's run
	// to completion and have no probes.
	LongRunning bool
}

// Workloads are the validated Deployments and Jobs among objs.
func Workloads(objs []*Object) []Workload {
	var out []Workload
	for _, o := range objs {
		switch t := o.Typed.(type) {
		case *appsv1.Deployment:
			out = append(out, Workload{o, &t.Spec.Template.Spec, true})
		case *appsv1.StatefulSet:
			out = append(out, Workload{o, &t.Spec.Template.Spec, true})
		case *appsv1.DaemonSet:
			out = append(out, Workload{o, &t.Spec.Template.Spec, true})
		case *batchv1.Job:
			out = append(out, Workload{o, &t.Spec.Template.Spec, false})
		case *batchv1.CronJob:
			out = append(out, Workload{o, &t.Spec.JobTemplate.Spec.Template.Spec, false})
		}
	}
	return out
}

// ImageEntrypoint is the sendonce image's ENTRYPOINT (Dockerfile).
const ImageEntrypoint = "/usr/local/bin/relay"

// Program is what a container runs, named as docs/configuration.md's
// sections are: "relay", "relay migrate", "relay console", "sender",
// "receiver". The relay's subcommand is its first argument.
func Program(c corev1.Container) (string, error) {
	argv := c.Command
	if len(argv) == 0 {
		argv = []string{ImageEntrypoint}
	}
	argv = append(append([]string{}, argv...), c.Args...)
	bin := path.Base(argv[0])
	switch bin {
	case "relay":
		if len(argv) > 1 && !strings.HasPrefix(argv[1], "-") {
			return "relay " + argv[1], nil
		}
		return "relay", nil
	case "sender", "receiver":
		return bin, nil
	}
	return "", fmt.Errorf("runs %q, not a sendonce program (/usr/local/bin/relay, sender or receiver)", strings.Join(argv, " "))
}

// SecurityProblems checks a pod's containers against the restricted
// Pod Security profile and the chart's own rules: non-root, read-only
// root, no privilege escalation, no capabilities, CPU and memory
// requests and limits, and probes on long-running containers.
func SecurityProblems(w Workload) []string {
	var problems []string
	var podNonRoot *bool
	if w.Pod.SecurityContext != nil {
		podNonRoot = w.Pod.SecurityContext.RunAsNonRoot
	}
	check := func(kind string, c corev1.Container, main bool) {
		where := fmt.Sprintf("%s %q", kind, c.Name)
		sc := c.SecurityContext
		if sc == nil {
			sc = &corev1.SecurityContext{}
		}
		nonRoot := podNonRoot
		if sc.RunAsNonRoot != nil {
			nonRoot = sc.RunAsNonRoot
		}
		if nonRoot == nil || !*nonRoot {
			problems = append(problems, where+": runAsNonRoot is not true (in the container's or the pod's securityContext)")
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			problems = append(problems, where+": securityContext.readOnlyRootFilesystem is not true")
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			problems = append(problems, where+": securityContext.allowPrivilegeEscalation is not false")
		}
		if sc.Capabilities == nil || !dropsAll(sc.Capabilities.Drop) {
			problems = append(problems, where+": securityContext.capabilities.drop does not hold ALL")
		}
		if sc.Capabilities != nil && len(sc.Capabilities.Add) > 0 {
			problems = append(problems, fmt.Sprintf("%s: securityContext.capabilities.add is %v", where, sc.Capabilities.Add))
		}
		if sc.Privileged != nil && *sc.Privileged {
			problems = append(problems, where+": securityContext.privileged is true")
		}
		for _, r := range []struct {
			name string
			list corev1.ResourceList
		}{{"requests", c.Resources.Requests}, {"limits", c.Resources.Limits}} {
			for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
				if q, ok := r.list[res]; !ok || q.Cmp(resource.Quantity{}) <= 0 {
					problems = append(problems, fmt.Sprintf("%s: resources.%s.%s is not set", where, r.name, res))
				}
			}
		}
		if main && w.LongRunning {
			if c.LivenessProbe == nil {
				problems = append(problems, where+": no livenessProbe")
			}
			if c.ReadinessProbe == nil {
				problems = append(problems, where+": no readinessProbe")
			}
		}
	}
	for _, c := range w.Pod.InitContainers {
		check("initContainer", c, false)
	}
	for _, c := range w.Pod.Containers {
		check("container", c, true)
	}
	return problems
}

func dropsAll(caps []corev1.Capability) bool {
	for _, c := range caps {
		if c == "ALL" {
			return true
		}
	}
	return false
}

// Env is the environment a container gets from the chart: envFrom
// ConfigMaps that the chart renders (keys with their prefix), then env.
// A value set from a Secret, a field or a resource has no literal value
// here (known false).
type EnvVar struct {
	Value string
	Known bool
	From  string // where it came from, for messages
}

func Env(c corev1.Container, configMaps map[string]*corev1.ConfigMap) map[string]EnvVar {
	env := map[string]EnvVar{}
	for _, from := range c.EnvFrom {
		if from.ConfigMapRef == nil {
			continue // a Secret's keys are not the chart's to know
		}
		cm := configMaps[from.ConfigMapRef.Name]
		if cm == nil {
			continue
		}
		for k, v := range cm.Data {
			env[from.Prefix+k] = EnvVar{v, true, "envFrom ConfigMap/" + cm.Name}
		}
	}
	for _, e := range c.Env {
		env[e.Name] = EnvVar{e.Value, e.ValueFrom == nil, "env"}
	}
	return env
}

// goRuntimeEnv are read by the Go runtime of every program, not by its
// flags: a chart may set them (GOMEMLIMIT from the memory limit, say).
var goRuntimeEnv = map[string]bool{"GOMAXPROCS": true, "GOMEMLIMIT": true, "GOGC": true, "GODEBUG": true}

// EnvProblems lists the variables a container sets that are no setting
// of its program in docs/configuration.md.
func EnvProblems(program string, env map[string]EnvVar, settings map[string]map[string]bool) []string {
	known, ok := settings[program]
	if !ok {
		return []string{fmt.Sprintf("docs/configuration.md has no settings table for %q: its variables cannot be checked (give it a generated table, as relay resolve has)", program)}
	}
	var problems []string
	for name, v := range env {
		if !known[name] && !goRuntimeEnv[name] {
			problems = append(problems, fmt.Sprintf("%s %s: not a setting of %s (docs/configuration.md)", v.From, name, program))
		}
	}
	return problems
}

// ProbeProblems checks that the liveness and readiness probes ask the
// program's telemetry server (HTTP_ADDR) for /healthz and /readyz.
func ProbeProblems(c corev1.Container, env map[string]EnvVar) []string {
	addr, ok := env["HTTP_ADDR"]
	switch {
	case !ok:
		return []string{"HTTP_ADDR is not set: the program's default listens on 127.0.0.1 only, where no kubelet probe reaches"}
	case !addr.Known:
		return []string{"HTTP_ADDR is set from a Secret or field: its port cannot be checked against the probes"}
	}
	host, portStr, err := net.SplitHostPort(addr.Value)
	if err != nil {
		return []string{fmt.Sprintf("HTTP_ADDR %q: %v", addr.Value, err)}
	}
	var problems []string
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		problems = append(problems, fmt.Sprintf("HTTP_ADDR %q listens on loopback only: no kubelet probe or scraper reaches it", addr.Value))
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return append(problems, fmt.Sprintf("HTTP_ADDR %q: port is not a number", addr.Value))
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"livenessProbe", c.LivenessProbe, LivenessPath}, {"readinessProbe", c.ReadinessProbe, ReadinessPath}} {
		if p.probe == nil {
			continue // SecurityProblems reports it
		}
		g := p.probe.HTTPGet
		if g == nil {
			problems = append(problems, fmt.Sprintf("%s: not an httpGet of %s", p.name, p.path))
			continue
		}
		if g.Path != p.path {
			problems = append(problems, fmt.Sprintf("%s.httpGet.path is %q, want %q", p.name, g.Path, p.path))
		}
		if got, ok := containerPort(c, g.Port); !ok || got != port {
			problems = append(problems, fmt.Sprintf("%s.httpGet.port is %s, want HTTP_ADDR's port %d", p.name, g.Port.String(), port))
		}
		if g.Scheme != "" && g.Scheme != corev1.URISchemeHTTP {
			problems = append(problems, fmt.Sprintf("%s.httpGet.scheme is %s: the telemetry server speaks plain HTTP", p.name, g.Scheme))
		}
	}
	return problems
}

// containerPort resolves a probe's port, a number or a port's name.
func containerPort(c corev1.Container, p intstr.IntOrString) (int, bool) {
	if p.Type == intstr.Int {
		return int(p.IntVal), true
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort), true
		}
	}
	return 0, false
}
