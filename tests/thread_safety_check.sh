#!/usr/bin/env bash
# Proves kvcached's lock annotations (ABSL_GUARDED_BY, ABSL_EXCLUSIVE_LOCKS_REQUIRED,
# server/common/mutex.h; KVCACHE_GPU_GUARDED_BY and friends, gpu/include/kvcache/gpu/mutex.h):
# every non-test source file of the server, the client, the shared wire helpers
# and the GPU tier library is compiled by clang-14 with -Wthread-safety
# -Werror=thread-safety. GCC ignores the annotations, so without this pass they
# prove nothing. gpu/src/cuda_device_memory.cc is compiled too when the CUDA
# headers are found (KVCACHE_TSA_CUDA_INCLUDE, else next to nvcc, else
# /usr/local/cuda/include); the pass says so when they are not.
#
# First, without clang, a guard: no non-test source under server/, client/,
# proto/ or gpu/ may declare a plain std::mutex (nor another std:: mutex type,
# nor a std::condition_variable, which only waits on one): the analysis cannot
# see them, so a lock that is one would silently fall outside the proof. Only
# the annotated wrappers hold one. `--guard-only` runs the guard alone.
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

# The guard. Comments are ignored; test sources (*_test.cc, *_test_util.h,
# gpu/tests/) may use what they like.
python3 - "$root" <<'EOF'
import os, re, sys
root = sys.argv[1]
wrappers = {"server/common/mutex.h", "server/common/shared_mutex.h",
            "gpu/include/kvcache/gpu/mutex.h"}
plain = re.compile(r"\bstd::(recursive_timed_|recursive_|timed_|shared_timed_|shared_)?mutex\b"
                   r"|\bstd::condition_variable\b(?!_any)")
found = []
for top in ("server", "client", "proto", "gpu"):
    for folder, _, names in os.walk(os.path.join(root, top)):
        for name in sorted(names):
            rel = os.path.relpath(os.path.join(folder, name), root)
            if not re.search(r"\.(h|hh|hpp|inc|cc|cpp|cu|cuh)$", name) or rel in wrappers:
                continue
            if re.search(r"_test(_util)?\.(h|cc)$", name) or rel.startswith("gpu/tests/"):
                continue
            text = open(os.path.join(root, rel), errors="replace").read()
            text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
            for number, line in enumerate(text.split("\n"), 1):
                if plain.search(re.sub(r"//.*", "", line)):
                    found.append(f"{rel}:{number}: {line.strip()}")
if found:
    print("thread_safety_check: plain std:: mutexes, which the analysis cannot see; use "
          "kvcache::Mutex (server/common/mutex.h), kvcache::gpu::Mutex "
          "(gpu/include/kvcache/gpu/mutex.h) or absl::Mutex, and annotate what it guards:",
          file=sys.stderr)
    print("\n".join(found), file=sys.stderr)
    sys.exit(1)
EOF
if [[ "${1:-}" == "--guard-only" ]]; then
  echo "thread_safety_check: guard passed (no plain std:: mutex outside the wrappers)"
  exit 0
fi
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
# The clang build has CUDA off, so CudaDeviceMemory gets the compile command of
# its sibling gpu/src/gpu_block_pool.cc plus the CUDA headers, when found.
cuda_include=${KVCACHE_TSA_CUDA_INCLUDE:-}
if [[ -z "$cuda_include" ]]; then
  if command -v nvcc >/dev/null; then
    cuda_include=$(dirname "$(dirname "$(command -v nvcc)")")/include
  else
    cuda_include=/usr/local/cuda/include
  fi
fi
[[ -f "$cuda_include/cuda_runtime_api.h" ]] || cuda_include=""
python3 - "$build/compile_commands.json" "$root" "$cuda_include" >"$build/tsa_commands.txt" <<'EOF'
import json, shlex, sys
commands, root, cuda_include = json.load(open(sys.argv[1])), sys.argv[2] + "/", sys.argv[3]
cuda_file, cuda_sibling = root + "gpu/src/cuda_device_memory.cc", root + "gpu/src/gpu_block_pool.cc"
if cuda_include and not any(c["file"] == cuda_file for c in commands):
    for c in list(commands):
        if c["file"] == cuda_sibling:
            args = [cuda_file if a == cuda_sibling else a for a in shlex.split(c["command"])]
            args[1:1] = ["-isystem", cuda_include]
            commands.append({"directory": c["directory"], "file": cuda_file,
                             "command": shlex.join(args)})
for c in commands:
    f = c["file"]
    if not f.startswith(root) or "/_deps/" in f or f.endswith(".pb.cc"):
        continue
    rel = f[len(root):]
    if not rel.startswith(("server/", "client/", "proto/", "gpu/")) or rel.endswith("_test.cc"):
        continue
    if rel.startswith("gpu/tests/"):
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
[[ -n "$cuda_include" ]] ||
  echo "thread_safety_check: no CUDA headers; gpu/src/cuda_device_memory.cc not checked"
echo "thread_safety_check: $count files clean under -Werror=thread-safety ($(($(date +%s) - start)) s)"
