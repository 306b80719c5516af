#!/usr/bin/env bash
# ensure-redis.sh installs Debian's redis-server for the side-by-side
# benchmark when it is missing and this machine can install packages:
# `make bench` runs it, and so does .ci/run before `make test` (whose short
# peers run measures Redis too); `make test` itself installs nothing. It
# never fails: without Redis the benchmark skips that row and says why.
command -v redis-server >/dev/null 2>&1 && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing redis-server (Debian package) for the benchmark" >&2
  (apt-get install -y redis-server || (apt-get update && apt-get install -y redis-server)) >/dev/null 2>&1 || true
fi
command -v redis-server >/dev/null 2>&1 || echo "redis-server is not available: the benchmark will skip Redis" >&2
exit 0
