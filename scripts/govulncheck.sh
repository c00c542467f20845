#!/usr/bin/env bash
# Supply-chain check: govulncheck over every package, offline. The vulnerability
# database is built from the golang.org/x/vulndb module (served by the Go
# module proxy; vuln.go.dev itself is not reachable here) with its own indexdb
# command, and cached per vulndb version.
#
# It fails on any vulnerability the code calls in a module we require. Findings
# in the standard library are printed but do not fail: they are fixed by the Go
# patch release the build uses (the Dockerfile builds with the newest 1.26.x),
# not by a change here.
set -euo pipefail
cd "$(dirname "$0")/.."

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

python3 - "$out" <<'PY'
import json, sys
dec = json.JSONDecoder()
text = open(sys.argv[1]).read()
i, called = 0, {}
while i < len(text):
    while i < len(text) and text[i].isspace():
        i += 1
    if i >= len(text):
        break
    obj, i = dec.raw_decode(text, i)
    f = obj.get("finding")
    if not f or not f.get("trace"):
        continue
    top = f["trace"][0]
    if "function" not in top:
        continue  # imported or required, but never called
    called.setdefault((top.get("module"), f["osv"]), f.get("fixed_version", "?"))
std = sorted(k for k in called if k[0] == "stdlib")
mods = sorted(k for k in called if k[0] != "stdlib")
for m, osv in std:
    print(f"note: {osv} in the standard library (fixed in {called[(m, osv)]}; comes with the Go patch release)")
for m, osv in mods:
    print(f"FAIL: {osv} in {m} is called (fixed in {called[(m, osv)]})")
print(f"govulncheck: {len(mods)} called vulnerabilities in required modules, {len(std)} in the standard library")
sys.exit(1 if mods else 0)
PY
