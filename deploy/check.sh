#!/usr/bin/env bash
# Checks everything under deploy/: the Prometheus alerting rules, their unit
# tests, the Prometheus config, and the Grafana dashboard.
#
#   bash deploy/check.sh
#
# Needs Go (to install promtool if it is missing) and python3. Works from any
# directory. PROMTOOL_VERSION overrides the promtool version installed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

PROMTOOL_VERSION="${PROMTOOL_VERSION:-v0.316.0}"
RULES=deploy/prometheus/alerts.yml
TESTS=deploy/prometheus/alerts_test.yml
CONFIG=deploy/prometheus/prometheus.yml
DASHBOARD=deploy/grafana/sendonce.json

step() { printf '\n==> %s\n' "$*"; }

# --- promtool ---------------------------------------------------------------
if ! command -v promtool >/dev/null 2>&1; then
	command -v go >/dev/null 2>&1 || { echo "promtool is not on PATH and there is no go to install it" >&2; exit 1; }
	gobin="$(go env GOBIN)"
	[ -n "$gobin" ] || gobin="$(go env GOPATH)/bin"
	export PATH="$PATH:$gobin"
fi
if ! command -v promtool >/dev/null 2>&1; then
	step "installing promtool $PROMTOOL_VERSION into $gobin (first run: a few minutes)"
	start=$SECONDS
	go install "github.com/prometheus/prometheus/cmd/promtool@$PROMTOOL_VERSION"
	echo "promtool installed in $((SECONDS - start))s"
fi
echo "promtool: $(command -v promtool)"

# --- rules ------------------------------------------------------------------
step "promtool check rules $RULES"
promtool check rules "$RULES"

step "promtool test rules $TESTS"
promtool test rules "$TESTS"

# Every alert in the rules file has a test that expects it to fire and one
# that expects it not to (exp_alerts: []).
step "every alert has a firing and a non-firing test"
if ! python3 -c 'import yaml' 2>/dev/null; then
	echo "  SKIPPED: python3 has no PyYAML (apt-get install python3-yaml)"
else
python3 - "$RULES" "$TESTS" <<'EOF'
import sys, yaml
rules_file, tests_file = sys.argv[1:]
alerts = {r["alert"] for g in yaml.safe_load(open(rules_file))["groups"] for r in g["rules"] if "alert" in r}
fires, quiet = set(), set()
for t in yaml.safe_load(open(tests_file))["tests"]:
    for c in t.get("alert_rule_test", []):
        (fires if c.get("exp_alerts") else quiet).add(c["alertname"])
bad = [f"{a}: no {what} test" for a in sorted(alerts)
       for what, s in (("firing", fires), ("non-firing", quiet)) if a not in s]
if bad:
    sys.exit("\n".join(bad))
print(f"  SUCCESS: {len(alerts)} alerts, each with firing and non-firing cases")
EOF
fi

# Annotations reach pagers and chat: no values, ids, numbers or bodies. Only
# the target labels (job, instance, namespace) and labels with a fixed set of
# values (reason, stream, table, measure) may be templated.
step "annotations template nothing but target labels and fixed label sets"
if grep -nE '\{\{' "$RULES" | grep -vE '^[^{]*(\{\{ \$labels\.(job|instance|namespace|reason|stream|table|measure) \}\}[^{]*)+$'; then
	echo "  FAILED: the lines above template something else (a value, an id?)" >&2
	exit 1
fi
echo "  SUCCESS"

# One name per alert (a route or a silence by name must mean one thing);
# every rule groups by namespace (environments never mix) unless it looks
# for an absent series; every alert links its runbook section, and the
# section exists.
step "unique names, grouping by namespace, runbook sections"
if ! python3 -c 'import yaml' 2>/dev/null; then
	echo "  SKIPPED: python3 has no PyYAML (apt-get install python3-yaml)"
else
python3 - "$RULES" docs/operations.md <<'EOF2'
import re, sys, yaml
rules_file, runbook = sys.argv[1:]
rules = [r for g in yaml.safe_load(open(rules_file))["groups"] for r in g["rules"] if "alert" in r]
errs, seen = [], set()
try:
    headings = {re.sub(r"[^a-z0-9 -]", "", l.lstrip("#").strip().lower()).replace(" ", "-")
                for l in open(runbook) if l.startswith("#")}
except FileNotFoundError:
    headings = set()
    errs.append(f"{runbook} is missing")
for r in rules:
    a = r["alert"]
    if a in seen:
        errs.append(f"{a}: two alerts have this name")
    seen.add(a)
    if "namespace" not in r["expr"] and "absent(" not in r["expr"]:
        errs.append(f"{a}: does not group by namespace")
    url = r.get("annotations", {}).get("runbook_url", "")
    m = re.fullmatch(r"https://github\.com/sendonce/sendonce/blob/main/docs/operations\.md#([a-z0-9-]+)", url)
    if not m:
        errs.append(f"{a}: runbook_url {url!r} is not a section of docs/operations.md")
    elif m.group(1) not in headings:
        errs.append(f"{a}: docs/operations.md has no section #{m.group(1)}")
if errs:
    sys.exit("\n".join(errs))
print(f"  SUCCESS: {len(rules)} alerts")
EOF2
fi

# --- config -----------------------------------------------------------------
# dns_sd_configs names are not resolved at check time, so this passes
# anywhere; it also checks the rule_files the config references.
step "promtool check config $CONFIG"
promtool check config "$CONFIG"

# --- dashboard --------------------------------------------------------------
step "dashboard $DASHBOARD"
python3 -m json.tool "$DASHBOARD" >/dev/null
echo "  valid JSON"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 - "$DASHBOARD" "$tmp/dashboard_rules.yml" <<'EOF'
import json, sys
path, out = sys.argv[1:]
d = json.load(open(path))
errs = []
for k in ("uid", "title", "schemaVersion", "panels", "templating"):
    if k not in d:
        errs.append(f"missing top-level {k!r}")
if not any(v.get("type") == "datasource" and v.get("name") == "datasource" for v in d.get("templating", {}).get("list", [])):
    errs.append("no 'datasource' template variable")
if not any(v.get("name") == "namespace" for v in d.get("templating", {}).get("list", [])):
    errs.append("no 'namespace' template variable")
ids, exprs = set(), []
for p in d.get("panels", []):
    if p.get("id") in ids:
        errs.append(f"duplicate panel id {p.get('id')}")
    ids.add(p.get("id"))
    if p.get("type") == "row":
        continue
    if p.get("datasource", {}).get("uid") != "${datasource}":
        errs.append(f"panel {p.get('title')!r}: datasource is not ${{datasource}}")
    if not p.get("targets"):
        errs.append(f"panel {p.get('title')!r}: no targets")
    for t in p.get("targets", []):
        if not t.get("expr"):
            errs.append(f"panel {p.get('title')!r}: target {t.get('refId')} has no expr")
        elif "$namespace" not in t["expr"]:
            errs.append(f"panel {p.get('title')!r}: target {t.get('refId')} ignores the namespace selector")
        else:
            exprs.append(t["expr"])
if errs:
    sys.exit("\n".join(errs))
# Let promtool parse every query: as recording rules, with Grafana's
# variables replaced by durations.
with open(out, "w") as f:
    f.write("groups:\n  - name: dashboard\n    rules:\n")
    for i, e in enumerate(exprs):
        e = e.replace("$__rate_interval", "1m").replace("$__interval", "1m")
        f.write(f"      - record: dashboard:query_{i}\n        expr: {json.dumps(e)}\n")
print(f"  {len([p for p in d['panels'] if p.get('type') != 'row'])} panels, {len(exprs)} queries, schemaVersion {d['schemaVersion']}")
EOF
echo "  promtool parses every dashboard query:"
promtool check rules "$tmp/dashboard_rules.yml"

# --- metric names -----------------------------------------------------------
# Every sendonce_ metric the rules and the dashboard use is defined in the Go
# code (catches a rename on either side).
step "metric names used in deploy/ exist in the Go code"
missing=0
for m in $(grep -vhE '^[[:space:]]*#' "$RULES" "$DASHBOARD" | grep -oE 'sendonce_[a-z_]*[a-z]' | sed -E 's/_(bucket|sum|count)$//' | sort -u); do
	if ! grep -rqF --include='*.go' --exclude='*_test.go' "\"$m\"" cmd internal; then
		echo "  not defined in cmd/ or internal/: $m" >&2
		missing=1
	fi
done
[ "$missing" = 0 ] || exit 1
echo "  SUCCESS"

step "deploy/ checks passed"
