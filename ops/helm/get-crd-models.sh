#!/usr/bin/env bash
# Bring the pinned JSON-schema models of the chart's custom resources (Prometheus
# Operator's and KEDA's, from the npm registry) once into a cache outside the git tree,
# and print the directory check-custom-resources.mjs takes.
#
# Environment:
#   VIGIL_CRD_MODELS_HOME   the cache   default ~/.cache/vigil/crd-models
#
# Exits 3, with the reason on stderr, when npm is not installed.
set -euo pipefail

PACKAGES=(@kubernetes-models/prometheus-operator@6.0.0 @kubernetes-models/keda@2.0.0)
HOME_DIR="${VIGIL_CRD_MODELS_HOME:-$HOME/.cache/vigil/crd-models}"
DIR="$HOME_DIR/$(printf '%s\n' "${PACKAGES[@]}" | sha256sum | cut -c1-12)"

if [ -f "$DIR/.complete" ]; then
  echo "$DIR/node_modules/@kubernetes-models"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "get-crd-models: npm is not installed; install Node.js 20+ with npm" >&2
  exit 3
fi
echo "get-crd-models: installing ${PACKAGES[*]} into $DIR (once)" >&2
rm -rf "$DIR"
mkdir -p "$DIR"
npm install --no-save --no-audit --no-fund --loglevel=error --prefix "$DIR" "${PACKAGES[@]}" >&2
touch "$DIR/.complete"
echo "$DIR/node_modules/@kubernetes-models"
