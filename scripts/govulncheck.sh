#!/usr/bin/env bash
# Supply-chain check: govulncheck over every package, offline. The vulnerability
# database is built from the golang.org/x/vulndb module (served by the Go
# module proxy; vuln.go.dev itself is not reachable here) with its own indexdb
# command, and cached per vulndb version.
#
# It fails on any vulnerability the code calls, in a module we require or in
# the standard library: a called standard-library finding is fixed by raising
# the toolchain line of go.mod to a Go patch release that has the fix (and the
# Dockerfile's golang image with it). Findings in packages that are imported
# but never called are printed and do not fail. scripts/vulnfilter reads
# govulncheck's JSON and decides; its test feeds it recorded runs.
#
# The analysis is of the toolchain go.mod pins, whatever GOTOOLCHAIN says
# here (the machine's go.env may say local): the standard library checked is
# the one the build uses.
set -euo pipefail
cd "$(dirname "$0")/.."

toolchain=$(go mod edit -json | python3 -c 'import json,sys; print(json.load(sys.stdin).get("Toolchain",""))')
if [ -z "$toolchain" ]; then
  echo "go.mod has no toolchain line: pin a Go patch release (go mod edit -toolchain=go1.N.P)" >&2
  exit 1
fi
export GOTOOLCHAIN="$toolchain"
echo "govulncheck: standard library of $(go env GOVERSION) (go.mod toolchain $toolchain)"

VULNDB_VERSION=v0.0.0-20261105234957-e22db6528018
GOVULNCHECK_VERSION=v1.9.0
cache="${XDG_CACHE_HOME:-$HOME/.cache}/sendonce-vulndb/$VULNDB_VERSION"

if [ ! -f "$cache/index/db.json" ]; then
  echo "building the vulnerability database from golang.org/x/vulndb@$VULNDB_VERSION"
  dir=$(go mod download -json "golang.org/x/vulndb@$VULNDB_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  rm -rf "$cache.tmp" && mkdir -p "$cache.tmp"
  (cd "$dir" && GOFLAGS=-mod=mod go run ./cmd/indexdb -vulns data/osv -out "$cache.tmp")
  rm -rf "$cache" && mv "$cache.tmp" "$cache"
fi

out=$(mktemp)
trap 'rm -f "$out"' EXIT
go run "golang.org/x/vuln/cmd/govulncheck@$GOVULNCHECK_VERSION" -db "file://$cache" -format json ./... > "$out"

go run ./scripts/vulnfilter < "$out"
