#!/usr/bin/env bash
# python_package_test: builds and installs the kvcache Python package (client/python) into a
# venv outside the repository, linking BUILD_DIR's C++ client library, and runs its pytest
# suite against BUILD_DIR's kvcached. Fails (never skips) when the package does not build.
#
# Usage: tests/python/run_package_tests.sh BUILD_DIR KVCACHED [PYTEST_ARGS...]
#   KVCACHE_PY_VENV  the venv (default: ${XDG_CACHE_HOME:-$HOME/.cache}/kvcache/python-venv-<id>,
#                    <id> naming BUILD_DIR, so that trees and build folders never share one)
#   KVCACHE_PYTHON   the interpreter the venv is made from (default /usr/bin/python3)
# The venv, pip's cache and the extension's CMake build folder (beside the venv) are kept
# between runs: a rerun only recompiles what changed (a few seconds).
set -euo pipefail
build=$(cd "$1" && pwd)
kvcached=$2
shift 2
root=$(cd "$(dirname "$0")/../.." && pwd)
python=${KVCACHE_PYTHON:-/usr/bin/python3}
id=$(printf '%s' "$build" | sha1sum | cut -c1-12)
venv=${KVCACHE_PY_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvcache/python-venv-$id}
mkdir -p "$(dirname "$venv")"

# One run at a time per venv.
exec 9>"$venv.lock"
flock 9

if ! "$venv/bin/python" -c 'import sys' 2>/dev/null; then
  rm -rf "$venv"
  "$python" -m venv "$venv" || {
    echo "run_package_tests: cannot create a venv with $python (apt install python3-venv)" >&2
    exit 1
  }
fi
# The build backend, nanobind and the test's needs, from PyPI once (then pip's cache).
if ! "$venv/bin/python" -c 'import scikit_build_core, nanobind, pytest, numpy' 2>/dev/null; then
  "$venv/bin/python" -m pip install -q --disable-pip-version-check \
    'scikit-build-core>=0.10' 'nanobind>=2.0' 'pytest>=7' 'numpy>=1.22'
fi

settings=(--config-settings=cmake.define.kvcache_client_DIR="$build/client"
          --config-settings=build-dir="$venv.build")
if command -v ccache >/dev/null; then
  settings+=(--config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
echo "run_package_tests: pip install $root/client/python (C++ client of $build)"
if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation \
  --no-deps --force-reinstall "${settings[@]}" "$root/client/python"; then
  echo "run_package_tests: FAILED to build the kvcache package" >&2
  exit 1
fi

cd "$venv.build"  # pytest and Python write nothing into the repository
PYTHONDONTWRITEBYTECODE=1 exec "$venv/bin/python" -m pytest -q -p no:cacheprovider \
  "$root/client/python/tests" --kvcached "$kvcached" "$@"
