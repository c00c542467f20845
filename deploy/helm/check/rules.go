package check

import (
	"fmt"
	"reflect"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
)

// RuleDiff lists how a PrometheusRule's spec differs from the rules of
// deploy/prometheus/alerts.yml (want): a group or rule missing or extra,
// an expression, duration, label or annotation not the same. Expressions
// are compared without their surrounding whitespace (a YAML block
// scalar's last newline).
func RuleDiff(want, got *monitoringv1.PrometheusRuleSpec) []string {
	var problems []string
	gotGroups := map[string]monitoringv1.RuleGroup{}
	for _, g := range got.Groups {
		gotGroups[g.Name] = g
	}
	for _, wg := range want.Groups {
		gg, ok := gotGroups[wg.Name]
		if !ok {
			problems = append(problems, fmt.Sprintf("spec.groups: no group %q (alerts.yml has it)", wg.Name))
			continue
		}
		delete(gotGroups, wg.Name)
		w, g := wg, gg
		w.Rules, g.Rules = nil, nil
		if !reflect.DeepEqual(w, g) {
			problems = append(problems, fmt.Sprintf("spec.groups[%s]: settings %+v, alerts.yml has %+v", wg.Name, g, w))
		}
		problems = append(problems, ruleDiff(wg.Name, wg.Rules, gg.Rules)...)
	}
	for name := range gotGroups {
		problems = append(problems, fmt.Sprintf("spec.groups: group %q is not in alerts.yml", name))
	}
	return problems
}

func ruleName(r monitoringv1.Rule) string {
	if r.Alert != "" {
		return "alert " + r.Alert
	}
	return "record " + r.Record
}

func ruleDiff(group string, want, got []monitoringv1.Rule) []string {
	var problems []string
	gotRules := map[string]monitoringv1.Rule{}
	for _, r := range got {
		if _, dup := gotRules[ruleName(r)]; dup {
			problems = append(problems, fmt.Sprintf("spec.groups[%s]: %s twice", group, ruleName(r)))
		}
		gotRules[ruleName(r)] = r
	}
	for _, wr := range want {
		name := ruleName(wr)
		where := fmt.Sprintf("spec.groups[%s].rules[%s]", group, name)
		gr, ok := gotRules[name]
		if !ok {
			problems = append(problems, where+": missing (alerts.yml has it)")
			continue
		}
		delete(gotRules, name)
		if we, ge := strings.TrimSpace(wr.Expr.String()), strings.TrimSpace(gr.Expr.String()); we != ge {
			problems = append(problems, fmt.Sprintf("%s.expr differs from alerts.yml:\n  chart:      %s\n  alerts.yml: %s", where, ge, we))
		}
		for _, f := range []struct {
			field     string
			want, got any
		}{
			{"for", wr.For, gr.For},
			{"keep_firing_for", wr.KeepFiringFor, gr.KeepFiringFor},
			{"labels", wr.Labels, gr.Labels},
			{"annotations", wr.Annotations, gr.Annotations},
		} {
			if !reflect.DeepEqual(f.want, f.got) {
				problems = append(problems, fmt.Sprintf("%s.%s is %s, alerts.yml has %s", where, f.field, show(f.got), show(f.want)))
			}
		}
	}
	for name := range gotRules {
		problems = append(problems, fmt.Sprintf("spec.groups[%s]: %s is not in alerts.yml", group, name))
	}
	return problems
}

func show(v any) string {
	rv := reflect.ValueOf(v)
	if rv.Kind() == reflect.Pointer {
		if rv.IsNil() {
			return "unset"
		}
		v = rv.Elem().Interface()
	}
	return fmt.Sprintf("%v", v)
}
