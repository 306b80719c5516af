#!/usr/bin/env bash
# build-k8s-binaries.sh builds kube-apiserver, etcd and kubectl from Go modules
# into OUTPUT_DIR, at the versions MODULE_DIR's go.mod pins: hack/k8s-binaries
# (the current Kubernetes, into bin/k8s) or hack/k8s-binaries-1.33 (the oldest
# one tested, into bin/k8s-1.33). Nothing is downloaded except Go modules.
# When the binaries already exist at the pinned versions the build is
# skipped, so this is cheap to call before every test run.
#
# Usage: hack/build-k8s-binaries.sh [OUTPUT_DIR [MODULE_DIR]]
#        (default: bin/k8s hack/k8s-binaries)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-"$root/bin/k8s"}
mod=${2:-"$root/hack/k8s-binaries"}
mkdir -p "$out"
out=$(cd "$out" && pwd)
mod=$(cd "$mod" && pwd)

# OUTPUT_DIR holds one module's binaries: .module names it (a directory with
# binaries and no .module was built from hack/k8s-binaries, the only module
# before there were two). Building another module's binaries over them is
# refused: the directory would hold another version than its name says
# until the next build of its own module.
module=${mod#"$root"/}
built_from=$(cat "$out/.module" 2>/dev/null || { [[ -f "$out/kube-apiserver" ]] && echo hack/k8s-binaries; } || true)
if [[ -n "$built_from" && "$built_from" != "$module" ]]; then
  echo "$out holds the binaries of $built_from, not of $module: give another OUTPUT_DIR (or remove $out)" >&2
  exit 1
fi

# The stamp records the exact module versions the binaries were built from.
stamp_wanted=$(cd "$mod" && sha256sum go.mod go.sum | sha256sum | cut -d' ' -f1)-$(go env GOVERSION)
stamp_file="$out/.stamp"

if [[ -f "$stamp_file" && "$(cat "$stamp_file")" == "$stamp_wanted" \
      && -x "$out/kube-apiserver" && -x "$out/etcd" && -x "$out/kubectl" ]]; then
  exit 0
fi

rm -f "$stamp_file"
cd "$mod"
k8s_version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
echo "building kube-apiserver, etcd and kubectl $k8s_version from Go modules ($mod) into $out (cold: 5 to 10 min, more under load; silent meanwhile)" >&2
start=$(date +%s)
export CGO_ENABLED=0
k8s_minor=$(echo "$k8s_version" | cut -d. -f2)
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
go build -trimpath -ldflags "$ldflags" -o "$out/etcd" go.etcd.io/etcd/server/v3
go build -trimpath -ldflags "$ldflags" -o "$out/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
go build -trimpath -ldflags "$ldflags" -o "$out/kubectl" k8s.io/kubernetes/cmd/kubectl
echo "$module" > "$out/.module"
echo "$stamp_wanted" > "$stamp_file"
echo "built in $(( $(date +%s) - start ))s" >&2
