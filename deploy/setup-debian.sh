#!/usr/bin/env bash
# Installs what building, running and testing kvcached needs on Debian 12.
# Idempotent: packages already present are left alone. Needs root (or sudo).
#   setup-debian.sh          everything: build, tests, benchmarks, tools
#   setup-debian.sh --build  only what building kvcached and kvcachectl needs
#                            (the image's build stage, deploy/Containerfile)
set -euo pipefail

# What `cmake --build --target kvcached kvcachectl` needs (tests and benchmarks off).
build_packages=(
  # toolchain
  build-essential cmake ninja-build pkg-config git
  # libraries
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libspdlog-dev prometheus-cpp-dev libcivetweb-dev libcli11-dev libzstd-dev nlohmann-json3-dev libxxhash-dev liburing-dev
  libhiredis-dev libssl-dev
)

# The rest: tests, benchmarks, sanitizer passes and their peers.
more_packages=(
  curl
  # the thread-safety pass (tests/thread_safety_check.sh)
  clang-14
  civetweb
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  # peers the tests and benchmarks talk to
  python3 python3-grpcio python3-protobuf prometheus redis-server redis-tools memcached
  # the manifest checks (tests/integration/k8s_manifests_test.sh): YAML, the Kubernetes API's
  # models for field names, shellcheck for the scripts the manifests embed
  python3-yaml python3-kubernetes shellcheck
  # the test certificates of tests/integration/security_test.py
  openssl
  # the status page's browser test (tests/integration/status_page_test.sh)
  chromium
  # the real-model evaluation's Python environment (numpy, gguf and the model come from PyPI)
  python3-venv python3-pip
  # the kvcache Python package's extension (client/python; scikit-build-core and nanobind from PyPI)
  python3-dev
)

case "${1:-}" in
  "") packages=("${build_packages[@]}" "${more_packages[@]}") ;;
  --build) packages=("${build_packages[@]}") ;;
  *)
    echo "usage: $0 [--build]" >&2
    exit 2
    ;;
esac

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
