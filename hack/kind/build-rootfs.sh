#!/usr/bin/env bash
# build-rootfs.sh makes the Debian root filesystem of the kind node image with
# debootstrap: systemd and the packages kind's base image installs, plus the
# container runtime from Debian (containerd, runc, the CNI plugins) and
# busybox-static (the demo image takes its shell from it). Only Debian's
# packages are downloaded, from the mirror this machine's apt is set up with.
#
# Usage: hack/kind/build-rootfs.sh OUT_DIR
# Leaves OUT_DIR/rootfs and OUT_DIR/.stamp; skipped when the stamp is current.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build-rootfs.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
suite=bookworm

# Keep this list in sync with the version of the stamp below.
packages=(
  # services
  systemd dbus
  # what Kubernetes components and kind call on the node
  conntrack iptables nftables iproute2 ethtool util-linux mount kmod
  libseccomp2 pigz fuse-overlayfs e2fsprogs bash ca-certificates jq procps
  # the container runtime
  containerd runc containernetworking-plugins
  # a static shell and utilities for small images
  busybox-static
)
stamp_wanted="$suite $(printf '%s ' "${packages[@]}")v1"
if [[ -f "$out/.stamp" && "$(cat "$out/.stamp")" == "$stamp_wanted" && -x "$out/rootfs/usr/bin/containerd" ]]; then
  exit 0
fi

if ! command -v debootstrap >/dev/null; then
  echo "installing debootstrap (Debian package)" >&2
  apt-get install -y -qq debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null; }
fi

# The Debian mirror apt already uses; nothing else is reached.
mirror=$(
  { grep -h '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}'
    grep -h '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}'; } |
    grep -v -- '-security' | grep '/debian/\?$' | head -n1
) || true
if [[ -z "$mirror" ]]; then
  echo "build-rootfs.sh: no Debian mirror found in apt's sources" >&2
  exit 1
fi

start=$(date +%s)
echo "debootstrap $suite into $out/rootfs (cold: a few minutes)" >&2
rm -rf "$out/rootfs" "$out/.stamp"
mkdir -p "$out"
include=$(IFS=,; echo "${packages[*]}")
nice -n 19 debootstrap --variant=minbase --include="$include" "$suite" "$out/rootfs" "$mirror" >"$out/debootstrap.log" 2>&1 || {
  tail -n 30 "$out/debootstrap.log" >&2
  exit 1
}

r="$out/rootfs"
# What kind's base image does after installing its packages: no services
# but the ones it enables, no kernel log in the journal, systemd as init.
find "$r/lib/systemd/system/sysinit.target.wants/" -name "systemd-tmpfiles-setup.service" -delete
rm -f "$r"/lib/systemd/system/multi-user.target.wants/* \
      "$r"/etc/systemd/system/*.wants/* \
      "$r"/lib/systemd/system/local-fs.target.wants/* \
      "$r"/lib/systemd/system/sockets.target.wants/*udev* \
      "$r"/lib/systemd/system/sockets.target.wants/*initctl* \
      "$r"/lib/systemd/system/basic.target.wants/*
echo "ReadKMsg=no" >>"$r/etc/systemd/journald.conf"
ln -sf /usr/lib/systemd/systemd "$r/sbin/init"
# kind and kubeadm expect the runtime where upstream installs it.
mkdir -p "$r/opt/cni/bin" "$r/etc/kubernetes/manifests" "$r/usr/local/sbin"
for p in "$r"/usr/lib/cni/*; do ln -sf "/usr/lib/cni/$(basename "$p")" "$r/opt/cni/bin/$(basename "$p")"; done
ln -sf /usr/sbin/runc "$r/usr/local/sbin/runc"
# Keep the image small: no apt lists, caches or docs.
rm -rf "$r"/var/cache/apt/archives/*.deb "$r"/var/lib/apt/lists/* "$r"/usr/share/doc/* "$r"/usr/share/man/* "$r"/usr/share/locale/*
: >"$r/etc/machine-id"

echo "$stamp_wanted" >"$out/.stamp"
echo "rootfs built in $(($(date +%s) - start))s ($(du -sh "$r" | cut -f1))" >&2
