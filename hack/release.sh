#!/usr/bin/env bash
# Builds the kubectl-dlock plugin for linux and darwin, amd64 and arm64, into
# dist/release/: one tarball per platform (the binary and the README), their
# sha256 sums, and the krew plugin manifest dlock.yaml that names them.
#
#   hack/release.sh VERSION [URL_BASE]
#
# URL_BASE is where the tarballs will be downloaded from (default: the
# project's GitHub release of VERSION).
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: hack/release.sh VERSION [URL_BASE]}
base=${2:-https://github.com/frontdesk-dev/frontdesk/releases/download/$version}
out=dist/release
rm -rf "$out"
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

platforms_yaml=""
for platform in linux/amd64 linux/arm64 darwin/amd64 darwin/arm64; do
	os=${platform%/*} arch=${platform#*/}
	dir=$work/$os-$arch
	mkdir -p "$dir"
	CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build -trimpath -ldflags "-s -w" -o "$dir/kubectl-dlock" ./cmd/kubectl-dlock
	cp README.md "$dir/"
	tarball=kubectl-dlock_${version}_${os}_${arch}.tar.gz
	# Reproducible: fixed owner, order and times.
	tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$dir" -cf - kubectl-dlock README.md | gzip -n > "$out/$tarball"
	sum=$(sha256sum "$out/$tarball" | cut -d' ' -f1)
	echo "$sum  $tarball" >> "$out/sha256sums.txt"
	platforms_yaml+="  - selector:
      matchLabels:
        os: $os
        arch: $arch
    uri: $base/$tarball
    sha256: $sum
    bin: kubectl-dlock
    files:
    - from: kubectl-dlock
      to: .
    - from: README.md
      to: .
"
	echo "built $out/$tarball ($sum)"
done

sed -e "s|@VERSION@|$version|" hack/krew/dlock.yaml.in > "$out/dlock.yaml"
printf '%s' "$platforms_yaml" >> "$out/dlock.yaml"
echo "wrote $out/dlock.yaml"
