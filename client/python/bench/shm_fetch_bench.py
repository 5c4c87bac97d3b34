#!/usr/bin/env python3
"""Python shared-memory fetch throughput against the C++ client's, in the same run.

Starts a kvcached (or uses --target), then alternates rounds of
  kvcache-bench fetch --transport shm --clients 1 --no-verify   (C++, kvcache::Client)
and the same workload from Python (kvcache.Client.fetch into a SharedRegion slice):
one client, 2 MiB blocks (32 layers x 8 KV heads x 128 x fp16, 16-token blocks), 4 blocks a
sequence, 8 sequences appended first, each fetch a random one of them. Both verify every
block's checksum (the client always does); neither checks a byte pattern while timed (this
script checks one fetch per sequence before timing). Prints GB/s (10^9 bytes) per round and
the medians, and Python's median as a fraction of C++'s.

  python client/python/bench/shm_fetch_bench.py --kvcached build/server/kvcached \\
      --cxx-bench build/tests/bench/kvcache-bench [--rounds 5] [--duration 3]
"""

import argparse
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import kvcache

LAYOUT = dict(num_layers=32, num_kv_heads=8, head_dim=128, dtype="fp16", block_tokens=16)
BLOCK_BYTES = 32 * 2 * 8 * 16 * 128 * 2  # 2 MiB


def cxx_round(bench, target, duration, blocks_per_seq, working_set):
    out = subprocess.run(
        [bench, "fetch", "--target", target, "--transport", "shm", "--clients", "1",
         "--duration", str(duration), "--no-verify", "--blocks-per-seq", str(blocks_per_seq),
         "--working-set", str(working_set), "--model", "bench-cxx"],
        check=True, capture_output=True, text=True).stdout
    m = re.search(r"^fetch\s+\d+\s+[\d.]+\s+([\d.]+)\s+([\d.]+)", out, re.M)
    if not m:
        sys.exit("cannot read kvcache-bench's output:\n" + out)
    return float(m.group(1)), float(m.group(2))


class PythonWorkload:
    def __init__(self, target, blocks_per_seq, working_set):
        self.c = kvcache.Client(target, data_path="shm")
        self.model = "bench-py"
        self.c.register_model(self.model, **LAYOUT)
        self.seq_bytes = blocks_per_seq * BLOCK_BYTES
        self.region = self.c.create_shared_region(2 * self.seq_bytes)
        arr = self.region.array
        self.src = arr[:self.seq_bytes]
        self.dst = arr[self.seq_bytes:2 * self.seq_bytes]
        rng = np.random.default_rng(7)
        self.seqs = []
        for s in range(working_set):
            tokens = rng.integers(0, 2**31, blocks_per_seq * 16, dtype=np.uint32)
            self.src[:] = rng.integers(0, 256, self.seq_bytes, dtype=np.uint8)
            self.c.append(self.model, tokens, self.src)
            self.dst[:] = 0
            assert self.c.fetch(self.model, tokens, self.dst).nbytes == self.seq_bytes
            assert np.array_equal(self.dst, self.src), "wrong bytes"
            self.seqs.append(tokens)

    def round(self, duration):
        fetch, model, dst, seqs = self.c.fetch, self.model, self.dst, self.seqs
        pick = random.Random(1).randrange
        clock = time.perf_counter
        lat = []
        moved = 0
        t0 = clock()
        end = t0 + duration
        while True:
            t = clock()
            moved += fetch(model, seqs[pick(len(seqs))], dst).nbytes
            done = clock()
            lat.append(done - t)
            if done >= end:
                break
        return moved / (clock() - t0) / 1e9, statistics.median(lat) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvcached", help="start this daemon on a temporary socket")
    ap.add_argument("--target", help="use this running daemon instead (unix://...)")
    ap.add_argument("--cxx-bench", required=True, help="path of kvcache-bench")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per round")
    ap.add_argument("--blocks-per-seq", type=int, default=4)
    ap.add_argument("--working-set", type=int, default=8)
    args = ap.parse_args()
    proc = None
    if args.target:
        target = args.target
    elif args.kvcached:
        tmp = tempfile.mkdtemp(prefix="kvcache-bench-")
        sock = os.path.join(tmp, "kvcached.sock")
        proc = subprocess.Popen(
            [args.kvcached, "--listen", "none", "--unix-socket", sock, "--metrics-address",
             "none", "--capacity-bytes", str(1 << 30)],
            stdout=open(os.path.join(tmp, "kvcached.log"), "wb"), stderr=subprocess.STDOUT)
        while not os.path.exists(sock + ".shm"):
            if proc.poll() is not None:
                sys.exit("kvcached did not start")
            time.sleep(0.05)
        target = "unix://" + sock
    else:
        sys.exit("give --kvcached or --target")
    try:
        py = PythonWorkload(target, args.blocks_per_seq, args.working_set)
        print(f"kvcache {kvcache.__version__}, target {target}, 2 MiB blocks, "
              f"{args.blocks_per_seq} blocks/seq, working set {args.working_set}, "
              f"{args.rounds} rounds of {args.duration:g}s each")
        print(f"load: {os.getloadavg()}")
        cxx, pyr, cxx_p50, py_p50 = [], [], [], []
        for r in range(args.rounds):
            gbs, p50 = cxx_round(args.cxx_bench, target, args.duration, args.blocks_per_seq,
                                 args.working_set)
            cxx.append(gbs)
            cxx_p50.append(p50)
            gbs, p50 = py.round(args.duration)
            pyr.append(gbs)
            py_p50.append(p50)
            print(f"round {r + 1}: C++ {cxx[-1]:.3f} GB/s (p50 {cxx_p50[-1]:.3f} ms)  "
                  f"Python {pyr[-1]:.3f} GB/s (p50 {py_p50[-1]:.3f} ms)")
        mc, mp = statistics.median(cxx), statistics.median(pyr)
        print(f"median: C++ {mc:.3f} GB/s  Python {mp:.3f} GB/s  "
              f"Python/C++ = {mp / mc:.3f}")
        lc, lp = statistics.median(cxx_p50), statistics.median(py_p50)
        print(f"median p50 fetch latency ({args.blocks_per_seq} blocks): C++ {lc:.3f} ms  "
              f"Python {lp:.3f} ms  C++/Python = {lc / lp:.3f}")
        print(f"load: {os.getloadavg()}")
        py.c.close()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)


if __name__ == "__main__":
    main()
