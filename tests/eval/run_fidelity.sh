#!/usr/bin/env bash
# Runs the fidelity evaluation on the real model (fidelity.py; docs/importance.md):
# prepares the evaluation's Python (eval_env.sh), fetches the model
# (fetch_model.sh), and passes every other argument to fidelity.py.
# `kvcache-eval model ...` runs this script.
#
# Usage: tests/eval/run_fidelity.sh BUILD_DIR --out results.json [fidelity.py options]
#        tests/eval/run_fidelity.sh BUILD_DIR --help
set -euo pipefail

if (($# < 1)); then
  echo "usage: $0 BUILD_DIR --out results.json [fidelity.py options]" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
build=$1
shift
python=$(bash "${here}/eval_env.sh" "${build}")
model=$(PYTHON="${python}" bash "${here}/fetch_model.sh")
exec "${python}" "${here}/fidelity.py" "${model}" "$@"
