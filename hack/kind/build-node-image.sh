#!/usr/bin/env bash
# build-node-image.sh builds a kind node image with no container registry:
#
#   1. a Debian root filesystem with systemd and the container runtime
#      (build-rootfs.sh, debootstrap),
#   2. the Kubernetes binaries from Go modules (hack/build-k8s-binaries.sh and
#      build-binaries.sh, the same k8s.io/kubernetes version),
#   3. the images the cluster's pods run (kube-apiserver, kube-controller-manager,
#      kube-scheduler, etcd, kube-proxy, CoreDNS, pause, nodenet), each a
#      root filesystem of static binaries turned into an image by
#      `docker import`, saved into one archive that the node imports into
#      containerd when it boots (node/systemd/preload-images.service),
#   4. the node image itself: the root filesystem with kind's base-image files
#      (entrypoint, systemd units, containerd config, from the
#      sigs.k8s.io/kind module test/go.mod pins) and all of the above,
#      imported with `docker import`, its metadata (STOPSIGNAL, ENTRYPOINT)
#      added by a one-line build FROM that local image.
#
# Every step is cached under bin/ and skipped when its inputs are unchanged;
# the node image carries a label with the hash of its inputs.
#
# Usage: hack/kind/build-node-image.sh [IMAGE]   (default frontdesk-kind-node:KUBERNETES_VERSION)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/kind/lib.sh
source "$here/lib.sh"
root=$(cd "$here/../.." && pwd)
work="$root/bin/kind"
k8s_bin="$root/bin/k8s"
start=$(date +%s)

"$here/build-rootfs.sh" "$work/rootfs"
"$root/hack/build-k8s-binaries.sh" "$k8s_bin"
"$here/build-binaries.sh" "$work/bin"

k8s_version=$(cd "$here" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
image=${1:-frontdesk-kind-node:$k8s_version}
kind_dir=$(cd "$root/test" && go mod download -json sigs.k8s.io/kind | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
kind_version=$(cd "$root/test" && go list -m -f '{{.Version}}' sigs.k8s.io/kind)
rootfs="$work/rootfs/rootfs"

stamp=$(
  {
    cat "$work/rootfs/.stamp" "$work/bin/.stamp" "$k8s_bin/.stamp"
    echo "$kind_version $image"
    find "$here/node" "$here/build-node-image.sh" "$here/lib.sh" -type f -print0 | sort -z | xargs -0 cat
  } | sha256sum | cut -d' ' -f1
)
if [[ "$(docker image inspect -f '{{index .Config.Labels "dev.frontdesk.kind.stamp"}}' "$image" 2>/dev/null)" == "$stamp" ]]; then
  echo "$image is current" >&2
  exit 0
fi

# The image names kubeadm uses at this version, so that nothing is pulled.
mapfile -t kubeadm_images < <("$work/bin/kubeadm" config images list --kubernetes-version "$k8s_version" 2>/dev/null)
image_for() { printf '%s\n' "${kubeadm_images[@]}" | grep -E "/$1:" | head -n1; }
pause_image=$(image_for pause)
nodenet_image="frontdesk.local/kind-nodenet:$k8s_version"

# with_libs DIR BINARY...: copies binaries of the Debian root filesystem and
# the shared libraries they load into DIR.
with_libs() {
  local dir=$1
  shift
  local f
  for f in "$@" $(chroot "$rootfs" ldd "$@" | grep -o '/[^ ]*' | sort -u); do
    mkdir -p "$dir$(dirname "$f")"
    cp -L "$rootfs$f" "$dir$f"
  done
}

echo "assembling the cluster images" >&2
stage="$work/stage"
rm -rf "$stage"
mkdir -p "$stage"
path_env='ENV PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
cluster_images=()
for c in kube-apiserver kube-controller-manager kube-scheduler etcd; do
  d="$stage/$c"
  base_fs "$d"
  if [[ -x "$work/bin/$c" ]]; then cp "$work/bin/$c" "$d/usr/local/bin/"; else cp "$k8s_bin/$c" "$d/usr/local/bin/"; fi
  name=$(image_for "$c")
  import_image "$name" "$d" "$path_env" "ENTRYPOINT [\"/usr/local/bin/$c\"]"
  cluster_images+=("$name")
done
# kube-proxy runs in nftables mode and calls nft.
d="$stage/kube-proxy"
base_fs "$d"
cp "$work/bin/kube-proxy" "$d/usr/local/bin/"
with_libs "$d" /usr/sbin/nft
name=$(image_for kube-proxy)
import_image "$name" "$d" "$path_env" 'ENTRYPOINT ["/usr/local/bin/kube-proxy"]'
cluster_images+=("$name")
d="$stage/coredns"
base_fs "$d"
cp "$work/bin/coredns" "$d/coredns"
name=$(image_for coredns)
# Root, as it binds port 53 (upstream's image has a file capability instead).
import_image "$name" "$d" 'ENTRYPOINT ["/coredns"]'
cluster_images+=("$name")
d="$stage/pause"
base_fs "$d"
cp "$work/bin/pause" "$d/pause"
import_image "$pause_image" "$d" 'USER 65535:65535' 'ENTRYPOINT ["/pause"]'
cluster_images+=("$pause_image")
d="$stage/nodenet"
base_fs "$d"
cp "$work/bin/nodenet" "$d/nodenet"
import_image "$nodenet_image" "$d" 'ENTRYPOINT ["/nodenet"]'
cluster_images+=("$nodenet_image")

echo "assembling the node root filesystem" >&2
node="$stage/node"
cp -a "$rootfs" "$node"
mkdir -p "$node/kind/images" "$node/kind/manifests" "$node/kind/bin" "$node/LICENSES"
docker save "${cluster_images[@]}" -o "$node/kind/images/cluster.tar"
# kind's base-image files, as its Dockerfile lays them out.
files="$kind_dir/images/base/files"
install -m 0755 "$files"/usr/local/bin/* "$node/usr/local/bin/"
install -m 0755 "$files"/kind/bin/* "$node/kind/bin/"
install -m 0644 "$files"/LICENSES/* "$node/LICENSES/"
install -m 0644 "$files"/etc/crictl.yaml "$node/etc/"
install -m 0644 "$files"/etc/containerd/* "$node/etc/containerd/"
install -m 0644 "$files"/etc/default/* "$node/etc/default/"
install -m 0644 "$files"/etc/sysctl.d/* "$node/etc/sysctl.d/"
install -m 0644 "$files"/etc/systemd/system/*.service "$files"/etc/systemd/system/*.slice "$node/etc/systemd/system/"
mkdir -p "$node/etc/systemd/system/kubelet.service.d"
install -m 0644 "$files"/etc/systemd/system/kubelet.service.d/* "$node/etc/systemd/system/kubelet.service.d/"
# Ours: an entrypoint before kind's for nodes that are not privileged
# (node/frontdesk-entrypoint), and the cluster images preloaded before
# the kubelet starts.
install -m 0755 "$here/node/frontdesk-entrypoint" "$node/usr/local/bin/"
install -m 0644 "$here/node/systemd/preload-images.service" "$node/etc/systemd/system/"
install -m 0644 "$here/node/systemd/12-preload-images.conf" "$node/etc/systemd/system/kubelet.service.d/"
# The runtime comes from Debian (/usr/bin); kind's units and scripts expect
# it in /usr/local/bin.
for b in containerd ctr containerd-shim-runc-v2; do ln -sf "/usr/bin/$b" "$node/usr/local/bin/$b"; done
install -m 0755 "$work/bin/crictl" "$node/usr/local/bin/"
install -m 0755 "$work/bin/kubelet" "$work/bin/kubeadm" "$k8s_bin/kubectl" "$node/usr/bin/"
# The sandbox image is the pause image built above.
sed -i "s|sandbox_image = .*|sandbox_image = \"$pause_image\"|" "$node/etc/containerd/config.toml"
# This machine's kernel may run cgroup v1, which the kubelet refuses by
# default since Kubernetes 1.35 (failCgroupV1); the flag wins over kubeadm's
# KubeletConfiguration.
echo 'KUBELET_EXTRA_ARGS=--runtime-cgroups=/system.slice/containerd.service --fail-cgroupv1=false' >"$node/etc/default/kubelet"
chroot "$node" sh -c "ctr oci spec | jq '.hooks.createContainer[.hooks.createContainer| length] |= . + {\"path\": \"/kind/bin/mount-product-files.sh\"}' | jq 'del(.process.rlimits)' > /etc/containerd/cri-base.json"
chroot "$node" systemctl enable kubelet.service containerd.service undo-mount-hacks.service preload-images.service 2>/dev/null
chroot "$node" systemctl mask systemd-binfmt.service 2>/dev/null
echo "$k8s_version" >"$node/kind/version"
sed "s|NODENET_IMAGE|$nodenet_image|" "$here/node/manifests/default-cni.yaml" >"$node/kind/manifests/default-cni.yaml"
install -m 0644 "$here/node/manifests/default-storage.yaml" "$node/kind/manifests/"

echo "importing the node image" >&2
base="frontdesk-kind-node-rootfs:$k8s_version"
import_image "$base" "$node"
printf 'FROM %s\nENV container=docker\nSTOPSIGNAL SIGRTMIN+3\nLABEL dev.frontdesk.kind.stamp=%s\nENTRYPOINT ["/usr/local/bin/frontdesk-entrypoint", "/sbin/init"]\n' "$base" "$stamp" |
  DOCKER_BUILDKIT=0 docker build -q -t "$image" - >/dev/null 2>&1
docker rmi "$base" >/dev/null
rm -rf "$stage"
echo "built $image in $(($(date +%s) - start))s ($(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%d MB", $1/1e6}'))" >&2
