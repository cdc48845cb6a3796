#!/usr/bin/env bash
# Bring a pinned tool of the chart's tests once into a cache outside the git tree, and print
# where it is.
#
#   ops/helm/get.sh helm         # helm, built from its Go module through the Go module
#                                # proxy (a few minutes the first time); prints the binary
#   ops/helm/get.sh crd-models   # the JSON-schema models of the chart's custom resources
#                                # (Prometheus Operator's and KEDA's, from the npm registry);
#                                # prints the directory check-custom-resources.mjs takes
#
# Environment:
#   HELM_VERSION       the helm v3 release to build   default v3.22.0
#   VIGIL_TOOLS_HOME   the cache                      default ~/.cache/vigil
#
# Exits 3, with the reason on stderr, when Go (helm) or npm (crd-models) is not installed.
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.22.0}"
CRD_PACKAGES=(@kubernetes-models/prometheus-operator@6.0.0 @kubernetes-models/keda@2.0.0)
CACHE="${VIGIL_TOOLS_HOME:-$HOME/.cache/vigil}"

# need COMMAND WHAT: stop with exit code 3 unless COMMAND is installed
need() {
  if ! command -v "$1" >/dev/null 2>&1; then
    echo "get.sh: $1 is not installed; $2" >&2
    exit 3
  fi
}

# bring DIR RESULT BUILD...: print RESULT if DIR was completed before, else run BUILD in a
# fresh DIR, mark it complete and print RESULT
bring() {
  local dir="$1" result="$2"
  shift 2
  if [ ! -f "$dir/.complete" ]; then
    rm -rf "$dir"
    mkdir -p "$dir"
    "$@" >&2
    touch "$dir/.complete"
  fi
  echo "$result"
}

case "${1:-}" in
  helm)
    dir="$CACHE/helm/$HELM_VERSION"
    if [ ! -f "$dir/.complete" ]; then
      need go "install Go 1.22+"
      echo "get.sh: building helm $HELM_VERSION into $dir (once; a few minutes)" >&2
    fi
    bring "$dir" "$dir/helm" env GOBIN="$dir" go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
    ;;
  crd-models)
    dir="$CACHE/crd-models/$(printf '%s\n' "${CRD_PACKAGES[@]}" | sha256sum | cut -c1-12)"
    if [ ! -f "$dir/.complete" ]; then
      need npm "install Node.js 20+ with npm"
      echo "get.sh: installing ${CRD_PACKAGES[*]} into $dir (once)" >&2
    fi
    bring "$dir" "$dir/node_modules/@kubernetes-models" \
      npm install --no-save --no-audit --no-fund --loglevel=error --prefix "$dir" "${CRD_PACKAGES[@]}"
    ;;
  *)
    echo "usage: ops/helm/get.sh helm|crd-models" >&2
    exit 2
    ;;
esac
