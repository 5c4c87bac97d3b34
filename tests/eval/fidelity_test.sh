#!/usr/bin/env bash
# Runs fidelity_test.py (the fidelity evaluation's parts and one short prompt
# on the real model) with the evaluation's Python and model.
# Usage: fidelity_test.sh BUILD_DIR
set -euo pipefail
if (($# != 1)); then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
python=$(bash "${here}/eval_env.sh" "$1")
model=$(PYTHON="${python}" bash "${here}/fetch_model.sh")
# One BLAS thread: on two shared cores more threads only contend.
OPENBLAS_NUM_THREADS=1 exec "${python}" "${here}/fidelity_test.py" "${model}"
