#!/usr/bin/env bash
# Quick start: installs what is missing, builds kvcached (Release) and runs it
# in the foreground with the embedded default configuration (TCP :50051,
# /tmp/kvcached.sock, metrics on :9464, 1 GiB host tier). Extra arguments go
# to kvcached, e.g. `deploy/run.sh --capacity-bytes 8589934592`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/deploy/setup-debian.sh"
build=${KVCACHE_BUILD_DIR:-$root/build-release}
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVCACHE_BUILD_TESTS=OFF \
  -DKVCACHE_BUILD_BENCHMARKS=OFF
cmake --build "$build" --target kvcached kvcachectl
exec "$build/server/kvcached" "$@"
