#!/usr/bin/env bash
# set-version.sh ROOT VERSION: sets Embark's release version in every place
# that names it (make set-version V=x.y.z runs it). VERSION is x.y.z or
# vx.y.z with an optional -prerelease; the VERSION file, image tags and the
# chart's appVersion get the leading v, the chart's version (SemVer for
# Helm) does not. manifests/version_test.go checks every place agrees with
# the VERSION file and that this script reaches each of them.
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 ROOT VERSION (e.g. make set-version V=0.2.0)" >&2
  exit 2
fi
root=$1
v=${2#v}
if ! [[ $v =~ ^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$ ]]; then
  echo "set-version: \"$2\" is not a version x.y.z or x.y.z-prerelease (e.g. 0.2.0, v0.2.0-rc.1)" >&2
  exit 2
fi
old=$(tr -d '[:space:]' < "$root/VERSION")
new=v$v

# The places; each edit must match, so a moved or renamed place fails here
# instead of being skipped.
edit() { # file sed-expression grep-pattern-after
  local file=$root/$1
  sed -i -E "$2" "$file"
  if ! grep -qE "$3" "$file"; then
    echo "set-version: $1 does not name $new after the edit: update test/tools/set-version.sh" >&2
    exit 1
  fi
}
printf '%s\n' "$new" > "$root/VERSION"
edit manifests/charts/embark/Chart.yaml "s/^version: .*/version: $v/; s/^appVersion: .*/appVersion: $new/" "^appVersion: $new\$"
grep -qE "^version: $v\$" "$root/manifests/charts/embark/Chart.yaml"
edit manifests/base/kustomization.yaml "s/^(  newTag: ).*/\1$new/" "^  newTag: $new\$"
edit manifests/istio-operator/istio-operator.yaml "s#(image: embark-mesh/onboarding-endpoint:).*#\1$new#" "image: embark-mesh/onboarding-endpoint:$new\$"
# docs/install.md names the tag in its push and inspect commands.
if [ "$old" != "$new" ]; then
  edit docs/install.md "s/:${old//./\\.}( |\$)/:$new\1/g" ":$new"
fi
echo "version $old -> $new"
