# lib.sh: helpers for the hack/kind scripts that assemble images from files
# with `docker import` (no FROM, no registry). Sourced, not run.

# base_fs DIR: the files every small image gets.
base_fs() {
  mkdir -p "$1/etc" "$1/tmp" "$1/usr/local/bin"
  chmod 1777 "$1/tmp"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$1/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' >"$1/etc/group"
  echo 'hosts: files dns' >"$1/etc/nsswitch.conf"
}

# import_image NAME DIR CHANGE...: docker import of DIR as NAME.
import_image() {
  local name=$1 dir=$2
  shift 2
  local changes=()
  for c in "$@"; do changes+=(--change "$c"); done
  tar --numeric-owner -C "$dir" -c . | docker import "${changes[@]}" - "$name" >/dev/null
  echo "  $name ($(du -sh "$dir" | cut -f1))" >&2
}
