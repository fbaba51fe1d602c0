#!/usr/bin/env bash
# Builds the real binaries Embark's tests run against into bin/testenv/ (git-ignored):
#   - from this pinned tools module: kube-apiserver, etcd, kube-controller-manager, kubectl;
#   - from the pinned tools module in istio/: Istio's own pilot-agent, istioctl and
#     pilot-discovery (istiod).
# Each binary is rebuilt only when it is missing or was built from a different pin
# (recorded in bin/testenv/.stamp-<name>).
# Usage: test/tools/install.sh [kube-apiserver|etcd|kube-controller-manager|kubectl|pilot-agent|istioctl|pilot-discovery ...]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${TESTENV_BIN:-$root/bin/testenv}
mkdir -p "$out"

# pin_of DIR: a short hash of a tools module's go.mod and go.sum, their
# contents only (not their paths), so that a checkout elsewhere (a git
# worktree sharing bin/testenv) agrees with this one.
pin_of() {
  cat "$1/go.mod" "$1/go.sum" | sha256sum | cut -c1-16
}

# k8s_ldflags: version stamps for the Kubernetes binaries (without them they report a garbage version).
k8s_ldflags() {
  local v minor
  v=$(cd "$here" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
  minor=$(echo "$v" | cut -d. -f2)
  echo "-s -w -X k8s.io/component-base/version.gitVersion=$v -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
}

plain_ldflags() {
  echo "-s -w"
}

# istio_ldflags: the version stamps Istio's own build sets. The version is the
# module's VERSION file plus "-dev" (as Istio's Makefile does for master); the
# revision is the commit of the pinned pseudo-version.
istio_ldflags() {
  local dir ver rev pkg=istio.io/istio/pkg/version
  # On a cold module cache `go list -m` reports no directory (the module is
  # not extracted until it is downloaded): download it first, and read the
  # directory and the version apart, so that an empty directory cannot shift
  # the version into its place.
  (cd "$here/istio" && go mod download istio.io/istio)
  dir=$(cd "$here/istio" && go list -m -f '{{.Dir}}' istio.io/istio)
  ver=$(cd "$here/istio" && go list -m -f '{{.Version}}' istio.io/istio)
  if [ -z "$dir" ] || [ ! -f "$dir/VERSION" ]; then
    echo "testenv: istio.io/istio $ver: no VERSION file in the module cache (directory '$dir')" >&2
    return 1
  fi
  rev=${ver##*-}
  echo "-s -w -X $pkg.buildVersion=$(tr -d '[:space:]' < "$dir/VERSION")-dev -X $pkg.buildGitRevision=$rev -X $pkg.buildStatus=Clean -X $pkg.buildTag=$ver -X $pkg.buildOS=$(go env GOOS) -X $pkg.buildArch=$(go env GOARCH)"
}

# build NAME PACKAGE MODULE-DIR LDFLAGS-FUNCTION
build() {
  local name=$1 pkg=$2 dir=$3 flagsfn=$4 pin
  pin=$(pin_of "$dir")
  if [ -x "$out/$name" ] && [ "$(cat "$out/.stamp-$name" 2>/dev/null)" = "$pin" ]; then
    echo "testenv: $name is up to date"
    return
  fi
  echo "testenv: building $name from $pkg (this takes a few minutes the first time)"
  local flags start=$SECONDS
  flags=$("$flagsfn")
  (cd "$dir" && CGO_ENABLED=0 go build -trimpath -ldflags "$flags" -o "$out/$name.tmp" "$pkg")
  mv "$out/$name.tmp" "$out/$name"
  echo "$pin" > "$out/.stamp-$name"
  echo "testenv: built $name in $((SECONDS - start))s"
}

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(etcd kube-apiserver kube-controller-manager)
  # Tests use the kubectl on PATH (/usr/bin/kubectl on this machine kind);
  # build one of the same version as the API server where there is none.
  command -v kubectl >/dev/null 2>&1 || targets+=(kubectl)
  # istioctl first: it compiles nearly everything pilot-agent needs.
  targets+=(istioctl pilot-agent pilot-discovery)
fi
for t in "${targets[@]}"; do
  case "$t" in
    kube-apiserver) build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$here" k8s_ldflags ;;
    kube-controller-manager) build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$here" k8s_ldflags ;;
    kubectl) build kubectl k8s.io/kubernetes/cmd/kubectl "$here" k8s_ldflags ;;
    etcd) build etcd go.etcd.io/etcd/server/v3 "$here" plain_ldflags ;;
    istioctl) build istioctl istio.io/istio/istioctl/cmd/istioctl "$here/istio" istio_ldflags ;;
    pilot-agent) build pilot-agent istio.io/istio/pilot/cmd/pilot-agent "$here/istio" istio_ldflags ;;
    pilot-discovery) build pilot-discovery istio.io/istio/pilot/cmd/pilot-discovery "$here/istio" istio_ldflags ;;
    *) echo "testenv: unknown binary $t" >&2; exit 2 ;;
  esac
done
