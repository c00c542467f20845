package check

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
)

// KedaScaledObjectCRD is where KEDA's module keeps the ScaledObject CRD.
func KedaScaledObjectCRD(kedaDir string) string {
	return filepath.Join(kedaDir, "config", "crd", "bases", "keda.sh_scaledobjects.yaml")
}

// TriggerProblems checks a ScaledObject's nats-jetstream triggers as
// KEDA's scaler (pkg/scalers/nats_jetstream_scaler.go) parses them:
// stream and consumer from the trigger's metadata;
// natsServerMonitoringEndpoint and account or accountID from the
// TriggerAuthentication's parameters or the metadata; lagThreshold and
// activationLagThreshold integers, useHttps a boolean. And the stream
// and consumer must be one of nats/'s consumers, on its stream.
func TriggerProblems(raw map[string]any, consumers map[string]string) []string {
	spec, _ := raw["spec"].(map[string]any)
	triggers, _ := spec["triggers"].([]any)
	var problems []string
	for i, t := range triggers {
		trig, _ := t.(map[string]any)
		if trig["type"] != "nats-jetstream" {
			continue
		}
		where := fmt.Sprintf("spec.triggers[%d]", i)
		md, _ := trig["metadata"].(map[string]any)
		str := func(k string) string { s, _ := md[k].(string); return s }
		_, hasAuth := trig["authenticationRef"]
		for _, k := range []string{"stream", "consumer"} {
			if str(k) == "" {
				problems = append(problems, fmt.Sprintf("%s.metadata.%s: missing (KEDA's nats-jetstream scaler requires it)", where, k))
			}
		}
		if !hasAuth { // else the TriggerAuthentication may hold them
			if str("natsServerMonitoringEndpoint") == "" {
				problems = append(problems, where+".metadata.natsServerMonitoringEndpoint: missing (KEDA's nats-jetstream scaler requires it)")
			}
			if str("account") == "" && str("accountID") == "" {
				problems = append(problems, where+".metadata: neither account nor accountID (KEDA's nats-jetstream scaler requires one)")
			}
		}
		for _, k := range []string{"lagThreshold", "activationLagThreshold"} {
			if v, ok := md[k]; ok {
				if _, err := strconv.ParseInt(fmt.Sprint(v), 10, 64); err != nil {
					problems = append(problems, fmt.Sprintf("%s.metadata.%s: %q is not an integer", where, k, v))
				}
			}
		}
		if v, ok := md["useHttps"]; ok {
			if _, err := strconv.ParseBool(fmt.Sprint(v)); err != nil {
				problems = append(problems, fmt.Sprintf("%s.metadata.useHttps: %q is not a boolean", where, v))
			}
		}
		if c := str("consumer"); c != "" {
			stream, ok := consumers[c]
			switch {
			case !ok:
				problems = append(problems, fmt.Sprintf("%s.metadata.consumer: %q is none of nats/*.consumer.json's durable names %v", where, c, slices.Sorted(maps.Keys(consumers))))
			case str("stream") != stream:
				problems = append(problems, fmt.Sprintf("%s.metadata.stream: %q, but consumer %q is on stream %q (nats/)", where, str("stream"), c, stream))
			}
		}
	}
	return problems
}
