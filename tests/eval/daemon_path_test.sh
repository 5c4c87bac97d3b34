#!/usr/bin/env bash
# The daemon path against its replicas (docs/testing.md, "The real model"): one
# real text's prefix through the real kvcached (appended as FP16, attention
# reported, compacted, fetched back) must give exactly what the replica
# computes, in prune mode (daemon_rule.py, two cases) and in budget mode
# (daemon_budget_rule.py: target_bytes 0.37, 0.2 and 0.6, per-head and
# per-layer reports): every block's precision map, the stored KVQ1 bytes
# (versions 1 and 2), the GetStats counts, the served KV bit for bit and the
# logits of a 64-token teacher-forced continuation decoded from it. Sets up
# the evaluation's venv and the model like reference_logits_test.sh; fails,
# saying why, when anything is missing.
# Usage: daemon_path_test.sh BUILD_DIR KVCACHED STUBS_DIR
set -euo pipefail

if (($# != 3)); then
  echo "usage: $0 BUILD_DIR KVCACHED STUBS_DIR" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
[[ -x "$2" ]] || { echo "daemon_path_test: no kvcached binary at $2" >&2; exit 1; }
[[ -f "$3/kvcache/v1/kvcache_pb2.py" ]] ||
  { echo "daemon_path_test: no Python stubs in $3 (build kvcache_python_stubs)" >&2; exit 1; }
text=/usr/share/common-licenses/GPL-3
[[ -f "${text}" ]] || { echo "daemon_path_test: ${text} is missing (base-files)" >&2; exit 1; }
python=$(bash "${here}/eval_env.sh" "$1")
model=$(PYTHON="${python}" bash "${here}/fetch_model.sh")
# One BLAS thread: the forward passes are small, and threads that spin on a
# busy 2-core machine made them 5x slower.
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
"${python}" "${here}/daemon_path.py" --kvcached "$2" --stubs "$3" --model "${model}" \
  --text "${text}" --prefix 384 --continuation 64 --block-tokens 16 --target-mass 0.9
