#!/usr/bin/env bash
# Checks the Helm chart deploy/helm/sendonce: renders it with Helm's own Go
# SDK for its default values and each ci/*-values.yaml (as `helm template`
# would, for a cluster with and without the KEDA and prometheus-operator
# CRDs), runs Helm's linter in strict mode, and validates every rendered
# object against the Kubernetes API types, KEDA's ScaledObject CRD and the
# prometheus-operator types, the security rules, and the repository's own
# settings (docs/configuration.md), nats/ and deploy/prometheus/alerts.yml.
#
#   bash deploy/helm/check.sh
#
# Needs only Go: the checks are the tests of the Go module deploy/helm/check,
# a module of its own so that Helm and the Kubernetes libraries stay out of
# the product's go.mod. The first run downloads them (and KEDA's module, for
# its CRD) from the Go module proxy. Works from any directory.
# SENDONCE_CHART=DIR checks another chart directory instead.
set -euo pipefail

if [ -n "${SENDONCE_CHART:-}" ]; then
	SENDONCE_CHART="$(cd "$SENDONCE_CHART" && pwd)"
	export SENDONCE_CHART
fi
cd "$(dirname "${BASH_SOURCE[0]}")/check"

echo "==> go test ./... in deploy/helm/check (chart: ${SENDONCE_CHART:-deploy/helm/sendonce})"
start=$SECONDS
go test -count=1 ./...
echo "==> chart checks passed in $((SECONDS - start))s"
