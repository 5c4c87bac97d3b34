#!/usr/bin/env bash
# Installs what building, running and testing kvcached needs on Debian 12.
# Idempotent: packages already present are left alone. Needs root (or sudo).
set -euo pipefail

packages=(
  # toolchain
  build-essential cmake ninja-build pkg-config git curl
  # the thread-safety pass (tests/thread_safety_check.sh)
  clang-14
  # libraries
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libspdlog-dev prometheus-cpp-dev libcivetweb-dev civetweb libcli11-dev libzstd-dev nlohmann-json3-dev libxxhash-dev liburing-dev
  libhiredis-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  # peers the tests and benchmarks talk to
  python3 python3-grpcio python3-protobuf prometheus redis-server redis-tools memcached
  # the test certificates of tests/integration/security_test.py
  openssl
  # the status page's browser test (tests/integration/status_page_test.sh)
  chromium
  # the real-model evaluation's Python environment (numpy, gguf and the model come from PyPI)
  python3-venv python3-pip
  # the kvcache Python package's extension (client/python; scikit-build-core and nanobind from PyPI)
  python3-dev
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
echo "setup-debian: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
