#!/usr/bin/env bash
# build-binaries.sh builds, from Go modules, the programs of the kind node image
# that hack/build-k8s-binaries.sh does not (kube-apiserver, etcd and kubectl
# come from there, at the same Kubernetes version):
#
#   hack/kind/go.mod         kubelet, kubeadm, kube-controller-manager,
#                            kube-scheduler, kube-proxy, and our own pause
#                            and nodenet (the pod network, cmd/nodenet)
#   hack/kind/addons/go.mod  coredns (kubeadm's plugins only) and crictl
#
# Static binaries (CGO_ENABLED=0) into OUT_DIR; skipped when OUT_DIR/.stamp
# matches the modules and the Go version.
#
# Usage: hack/kind/build-binaries.sh OUT_DIR
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build-binaries.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)

stamp_wanted=$(cd "$here" && cat go.mod go.sum addons/go.mod addons/go.sum cmd/*/*.go addons/cmd/*/*.go | sha256sum | cut -d' ' -f1)-$(go env GOVERSION)
k8s_bins=(kubelet kubeadm kube-controller-manager kube-scheduler kube-proxy)
all=("${k8s_bins[@]}" pause nodenet coredns crictl)
current=true
for b in "${all[@]}"; do [[ -x "$out/$b" ]] || current=false; done
if $current && [[ -f "$out/.stamp" && "$(cat "$out/.stamp")" == "$stamp_wanted" ]]; then
  exit 0
fi

mkdir -p "$out"
rm -f "$out/.stamp"
start=$(date +%s)
export CGO_ENABLED=0
cd "$here"
k8s_version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
k8s_minor=$(echo "$k8s_version" | cut -d. -f2)
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
# The longest step of a cold node image, and it prints nothing while it runs.
echo "building ${all[*]} from Go modules into $out (cold: 20 to 50 min on 2 cores, the longer under load; silent meanwhile)" >&2
pkgs=()
for b in "${k8s_bins[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
# One go build at a time: each links several packages in one invocation.
nice -n 19 go build -trimpath -ldflags "$ldflags" -o "$out/" "${pkgs[@]}" ./cmd/pause ./cmd/nodenet
cd "$here/addons"
nice -n 19 go build -trimpath -ldflags "-s -w" -o "$out/" ./cmd/coredns sigs.k8s.io/cri-tools/cmd/crictl
echo "$stamp_wanted" >"$out/.stamp"
echo "built in $(($(date +%s) - start))s" >&2
