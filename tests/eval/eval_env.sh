#!/usr/bin/env bash
# Prepares the Python environment of the real-model evaluation and prints its
# interpreter: a virtual environment with pinned numpy, gguf and tokenizers
# from PyPI, created with --system-site-packages so Debian's python3-grpcio
# (and python3-protobuf, matching the daemon's protoc) are visible for the
# daemon path. Created once and kept; a venv missing a package is repaired.
#
# Usage: tests/eval/eval_env.sh BUILD_DIR      prints BUILD_DIR/eval-venv/bin/python
#   KVCACHE_EVAL_VENV  the venv's folder instead of BUILD_DIR/eval-venv
# Exit status 1, saying what to do, when the venv or pip fails.
set -euo pipefail

if (($# != 1)); then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
venv="${KVCACHE_EVAL_VENV:-$(realpath "$1")/eval-venv}"
readonly requirements=("numpy==2.4.6" "gguf==0.19.0" "tokenizers==0.23.3")

ready() {
  "${venv}/bin/python" - <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
want = {"numpy": "2.4.6", "gguf": "0.19.0", "tokenizers": "0.23.3"}
sys.exit(0 if all(version(k) == v for k, v in want.items()) else 1)
PY
}

if [[ ! -x "${venv}/bin/python" ]] || ! ready; then
  if [[ -x "${venv}/bin/python" ]] &&
     ! grep -q "include-system-site-packages = true" "${venv}/pyvenv.cfg" 2>/dev/null; then
    rm -rf "${venv}"  # made before the daemon path needed Debian's grpc
  fi
  /usr/bin/python3 -m venv --system-site-packages "${venv}" >&2 ||
    { echo "eval_env.sh: cannot create a venv (apt-get install python3-venv)" >&2; exit 1; }
  "${venv}/bin/pip" install --quiet "${requirements[@]}" >&2 ||
    { echo "eval_env.sh: pip could not install ${requirements[*]} from PyPI" >&2; exit 1; }
fi
echo "${venv}/bin/python"
