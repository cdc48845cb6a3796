#!/usr/bin/env bash
# Bring the pinned helm once into a cache outside the git tree (built from its Go module
# through the Go module proxy: a few minutes the first time) and print its path.
#
#   ops/helm/get-helm.sh            # prints e.g. ~/.cache/vigil/helm/v3.22.0/helm
#
# Environment:
#   HELM_VERSION      the helm v3 release to build   default v3.22.0
#   VIGIL_HELM_HOME   the cache                      default ~/.cache/vigil/helm
#
# Exits 3, with the reason on stderr, when Go is not installed.
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.22.0}"
VIGIL_HELM_HOME="${VIGIL_HELM_HOME:-$HOME/.cache/vigil/helm}"
BIN_DIR="$VIGIL_HELM_HOME/$HELM_VERSION"
HELM="$BIN_DIR/helm"

if [ -x "$HELM" ]; then
  echo "$HELM"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  echo "get-helm: Go is not installed; install Go 1.22+ (or put helm $HELM_VERSION at $HELM)" >&2
  exit 3
fi
echo "get-helm: building helm $HELM_VERSION into $BIN_DIR (once; a few minutes)" >&2
mkdir -p "$BIN_DIR"
GOBIN="$BIN_DIR.partial" GOFLAGS=-mod=mod go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
mv "$BIN_DIR.partial/helm" "$HELM"
rmdir "$BIN_DIR.partial"
echo "$HELM"
