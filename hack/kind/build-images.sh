#!/usr/bin/env bash
# build-images.sh assembles frontdesk's own images from Go binaries, without a
# FROM that needs a registry: the same contents as Dockerfile,
# Dockerfile.kubectl-dlock and Dockerfile.demo (static binaries, user
# 65532:65532; the demo image gets busybox from Debian's busybox-static for
# sh, pkill and wget), each turned into an image by `docker import`. The
# plugin image gets busybox too, which Dockerfile.kubectl-dlock's has not:
# the e2e tests run commands under a lock with it (`kubectl dlock run NAME --
# sh -c ...`).
# Where a registry is reachable, `make docker-build` builds the same images
# from the Dockerfiles.
#
# Usage: hack/kind/build-images.sh MANAGER_IMAGE PLUGIN_IMAGE DEMO_IMAGE
#        SOURCE_REF=COMMIT hack/kind/build-images.sh MANAGER_IMAGE PLUGIN_IMAGE
# An image is rebuilt only when its binary changed (label dev.frontdesk.kind.stamp).
#
# With SOURCE_REF, the manager and kubectl-dlock are built from that commit
# of this repository (git archive, kept under bin/kind/source/), for the
# e2e test of an upgrade from an earlier release, and no demo image is
# built.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=hack/kind/lib.sh
source "$here/lib.sh"
usage="usage: build-images.sh MANAGER_IMAGE PLUGIN_IMAGE DEMO_IMAGE, or SOURCE_REF=COMMIT build-images.sh MANAGER_IMAGE PLUGIN_IMAGE"
manager_image=${1:?$usage}
plugin_image=${2:?$usage}
src="$root"
work="$root/bin/kind/frontdesk"
if [[ -n "${SOURCE_REF:-}" ]]; then
  commit=$(git -C "$root" rev-parse --verify "$SOURCE_REF^{commit}")
  src="$root/bin/kind/source/$commit"
  work="$root/bin/kind/frontdesk-$commit"
  if [[ ! -f "$src/.complete" ]]; then
    rm -rf "$src"
    mkdir -p "$src"
    git -C "$root" archive "$commit" | tar -x -C "$src"
    touch "$src/.complete"
  fi
else
  demo_image=${3:?$usage}
fi
start=$(date +%s)

# busybox comes from the node image's Debian root filesystem.
"$here/build-rootfs.sh" "$root/bin/kind/rootfs"
busybox="$root/bin/kind/rootfs/rootfs/bin/busybox"

mkdir -p "$work/bin"
cd "$src"
export CGO_ENABLED=0 GOOS=linux GOARCH=amd64
nice -n 19 go build -trimpath -ldflags="-s -w" -o "$work/bin/manager" .
nice -n 19 go build -trimpath -ldflags="-s -w" -o "$work/bin/" ./cmd/kubectl-dlock
if [[ -z "${SOURCE_REF:-}" ]]; then
  nice -n 19 go -C test build -trimpath -ldflags="-s -w" -o "$work/bin/" ./cmd/frontdesk-demo # the test module
fi

# image NAME BINARY [busybox]: one image with /BINARY as its entrypoint.
image() {
  local name=$1 bin=$2 with_busybox=${3:-}
  local stamp
  stamp=$(cat "$work/bin/$bin" "$here/lib.sh" "$here/build-images.sh" ${with_busybox:+"$busybox"} | sha256sum | cut -d' ' -f1)
  if [[ "$(docker image inspect -f '{{index .Config.Labels "dev.frontdesk.kind.stamp"}}' "$name" 2>/dev/null)" == "$stamp" ]]; then
    return
  fi
  local d="$work/stage/$bin"
  rm -rf "$d"
  base_fs "$d"
  mkdir -p "$d/etc/ssl/certs" "$d/home/nonroot"
  chown 65532:65532 "$d/home/nonroot"
  cp "$root/bin/kind/rootfs/rootfs/etc/ssl/certs/ca-certificates.crt" "$d/etc/ssl/certs/"
  cp "$work/bin/$bin" "$d/$bin"
  if [[ -n "$with_busybox" ]]; then
    mkdir -p "$d/bin"
    cp "$busybox" "$d/bin/busybox"
    for applet in $("$busybox" --list); do
      [[ -e "$d/bin/$applet" ]] || ln -s busybox "$d/bin/$applet"
    done
  fi
  import_image "$name" "$d" 'ENV PATH=/bin:/usr/local/bin' 'USER 65532:65532' 'WORKDIR /' \
    "LABEL dev.frontdesk.kind.stamp=$stamp" "ENTRYPOINT [\"/$bin\"]"
  rm -rf "$d"
}

image "$manager_image" manager
image "$plugin_image" kubectl-dlock busybox
if [[ -z "${SOURCE_REF:-}" ]]; then
  image "$demo_image" frontdesk-demo busybox
fi
echo "frontdesk images ready in $(($(date +%s) - start))s" >&2
