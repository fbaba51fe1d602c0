#!/usr/bin/env bash
# Builds the real control-plane binaries Embark's tests run against into bin/testenv/
# (git-ignored) from this pinned tools module. Each binary is rebuilt only when it is
# missing or was built from a different pin (recorded in bin/testenv/.stamp-<name>).
# Usage: test/tools/install.sh [kube-apiserver|etcd|kube-controller-manager|kubectl ...]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${TESTENV_BIN:-$root/bin/testenv}
mkdir -p "$out"

k8s_version=$(cd "$here" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
pin=$(sha256sum "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-16)
minor=$(echo "$k8s_version" | cut -d. -f2)
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"

build() {
  local name=$1 pkg=$2 flags=$3
  if [ -x "$out/$name" ] && [ "$(cat "$out/.stamp-$name" 2>/dev/null)" = "$pin" ]; then
    echo "testenv: $name is up to date"
    return
  fi
  echo "testenv: building $name from $pkg (this takes a few minutes the first time)"
  (cd "$here" && CGO_ENABLED=0 go build -trimpath -ldflags "$flags" -o "$out/$name.tmp" "$pkg")
  mv "$out/$name.tmp" "$out/$name"
  echo "$pin" > "$out/.stamp-$name"
}

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(etcd kube-apiserver kube-controller-manager)
  # Tests use the kubectl on PATH (/usr/bin/kubectl on this machine kind);
  # build one of the same version as the API server where there is none.
  command -v kubectl >/dev/null 2>&1 || targets+=(kubectl)
fi
for t in "${targets[@]}"; do
  case "$t" in
    kube-apiserver) build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$ldflags" ;;
    kube-controller-manager) build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$ldflags" ;;
    kubectl) build kubectl k8s.io/kubernetes/cmd/kubectl "$ldflags" ;;
    etcd) build etcd go.etcd.io/etcd/server/v3 "-s -w" ;;
    *) echo "testenv: unknown binary $t" >&2; exit 2 ;;
  esac
done
