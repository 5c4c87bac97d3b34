#!/usr/bin/env bash
# Proves kvcached's lock annotations (ABSL_GUARDED_BY, ABSL_EXCLUSIVE_LOCKS_REQUIRED,
# server/core/mutex.h): every non-test source file of the server, the client and
# the shared wire helpers is compiled by clang-14 with -Wthread-safety
# -Werror=thread-safety. GCC ignores the annotations, so without this pass they
# prove nothing.
#
# Cheap on purpose: it configures a clang build (tests, benchmarks and CUDA
# off), generates only the protobuf headers, then runs each file's compile
# command with -fsyntax-only (the analysis runs in the front end; no code is
# generated, nothing is linked). About 5 minutes cold on 2 cores
# (docs/testing.md).
#   KVCACHE_TSA_BUILD_DIR  build folder (default: build-thread-safety)
#   KVCACHE_TSA_JOBS       parallel compiles (default: nproc)
# Exits non-zero, printing the warnings, when any file has one.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVCACHE_TSA_BUILD_DIR:-$root/build-thread-safety}
jobs=${KVCACHE_TSA_JOBS:-$(nproc)}
cxx=${KVCACHE_TSA_CXX:-clang++-14}
cc=${KVCACHE_TSA_CC:-clang-14}
command -v "$cxx" >/dev/null || {
  echo "thread_safety_check: $cxx not found (deploy/setup-debian.sh installs clang-14)" >&2
  exit 1
}

start=$(date +%s)
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
  -DKVCACHE_ENABLE_CUDA=OFF -DKVCACHE_BUILD_TESTS=OFF -DKVCACHE_BUILD_BENCHMARKS=OFF >/dev/null
# The generated protobuf headers the sources include (protoc only, no compile).
mapfile -t generated < <(ninja -C "$build" -t targets all | sed -n 's/^\(.*\.pb\.h\): .*/\1/p')
ninja -C "$build" "${generated[@]}" >/dev/null

# One line per translation unit: the compile command with -fsyntax-only in
# place of -c/-o, and the thread-safety warnings made errors.
python3 - "$build/compile_commands.json" "$root" >"$build/tsa_commands.txt" <<'EOF'
import json, shlex, sys
commands, root = json.load(open(sys.argv[1])), sys.argv[2] + "/"
for c in commands:
    f = c["file"]
    if not f.startswith(root) or "/_deps/" in f or f.endswith(".pb.cc"):
        continue
    rel = f[len(root):]
    if not rel.startswith(("server/", "client/", "proto/")) or rel.endswith("_test.cc"):
        continue
    args, out, skip = shlex.split(c["command"]), [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT"):
            skip = True
            continue
        if a in ("-c", "-MD"):
            continue
        out.append(a)
    out[1:1] = ["-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety"]
    print("cd " + shlex.quote(c["directory"]) + " && " + shlex.join(out))
EOF
count=$(wc -l <"$build/tsa_commands.txt")
log="$build/tsa.log"
status=0
tr '\n' '\0' <"$build/tsa_commands.txt" | xargs -0 -P "$jobs" -n 1 bash -c >"$log" 2>&1 || status=$?
if ((status != 0)); then
  grep -B2 -A6 "error:" "$log" || cat "$log"
  echo "thread_safety_check: FAILED ($count files, $(($(date +%s) - start)) s)" >&2
  exit 1
fi
echo "thread_safety_check: $count files clean under -Werror=thread-safety ($(($(date +%s) - start)) s)"
