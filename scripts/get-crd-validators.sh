#!/usr/bin/env bash
# Put the validators of the custom resources the chart renders (KEDA's ScaledObject, the
# Prometheus Operator's ServiceMonitor and PodMonitor, Gateway API's HTTPRoute) at DIR (default
# .venv/crd-validators).
#
# No registry carries those projects' CRD YAMLs, so their openAPIV3Schema cannot be read here.
# The npm packages of kubernetes-models-ts carry the next best thing: validators generated from
# the same upstream Go API types (keda.sh/v1alpha1, monitoring.coreos.com/v1,
# gateway.networking.k8s.io/v1) that controller-gen turns into the CRDs.
# tests/chart/crd_validate.mjs runs them. Versions are pinned; npm checks each tarball against
# the registry's integrity hash.
#
#   scripts/get-crd-validators.sh [DIR]      # idempotent: does nothing when DIR has them
#
# Needs node >= 18 and npm; no root.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${1:-$ROOT/.venv/crd-validators}"
PACKAGES=(
    "@kubernetes-models/keda@2.0.0"
    "@kubernetes-models/prometheus-operator@6.0.0"
    "@kubernetes-models/gateway-api@2.0.0"
)

die() { echo "get-crd-validators: $*" >&2; exit 1; }

for tool in node npm; do
    command -v "$tool" >/dev/null || die "$tool is needed and not on PATH (Debian: apt-get install nodejs npm)"
done

installed() {
    local spec name version
    for spec in "${PACKAGES[@]}"; do
        name="${spec%@*}" version="${spec##*@}"
        node -e 'const p = require(process.argv[1]); process.exit(p.version === process.argv[2] ? 0 : 1)' \
            "$DEST/node_modules/$name/package.json" "$version" 2>/dev/null || return 1
    done
}

mkdir -p "$DEST"
DEST="$(cd "$DEST" && pwd)"  # absolute: node's require() reads a bare relative path as a package
if installed; then
    echo "get-crd-validators: $DEST has ${PACKAGES[*]}"
    exit 0
fi
[ -f "$DEST/package.json" ] || echo '{"private": true}' >"$DEST/package.json"
npm install --prefix "$DEST" --no-audit --no-fund --save-exact --loglevel=error "${PACKAGES[@]}" \
    || die "npm install failed (is the npm registry reachable?)"
installed || die "npm installed something else than ${PACKAGES[*]}"
echo "get-crd-validators: installed ${PACKAGES[*]} into $DEST"
