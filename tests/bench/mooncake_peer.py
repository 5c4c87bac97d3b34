#!/usr/bin/env python3
"""Load generator for Mooncake Store, the second peer of run_benchmarks.sh.

Runs N worker processes against a running mooncake_master and a storage process that mounts
the global segment (run_benchmarks.sh starts `mooncake_client --global_segment_size ...`). Each
worker is its own MooncakeDistributedStore client that contributes no memory of its own
(global_segment_size 0), so every put and get moves the value to or from the storage process
over Mooncake's transfer engine, protocol "tcp" on loopback: the remote path, like Redis over
TCP and kvcached over gRPC.

  put: each worker upserts values of --size bytes into its own --keys keys, in turn
       (upsert_from a registered buffer, like Redis SET of one of a few keys).
  get: --keys values are stored first (not timed); each worker then reads them in turn
       (get_into a registered buffer, zero-copy on the client side), checking the length
       returned and, with --verify, the bytes.

Prints the same table as kvcache-bench, so run_benchmarks.sh parses both alike:
  op  count  ops/s  GB/s  p50_ms  p99_ms  max_ms  errors
Exit status 1 if any operation failed. Needs the `mooncake` package
(pip install mooncake-transfer-engine-non-cuda) and libibverbs.so.1 (Debian: libibverbs1),
which the wheel links even when only TCP is used.
"""

import argparse
import ctypes
import multiprocessing as mp
import sys
import time


def _pattern(size, seed):
    b = bytes((seed + i) & 0xFF for i in range(256))
    return (b * (size // 256 + 1))[:size]


def _worker(idx, args, barrier, results):
    from mooncake.store import MooncakeDistributedStore  # imported per process

    store = MooncakeDistributedStore()
    # Local buffer: the client's staging area; two values fit.
    rc = store.setup(args.host, args.metadata, 0, max(16 << 20, 2 * args.size), "tcp", "",
                     args.master)
    if rc != 0:
        results.put((idx, None, f"setup returned {rc}"))
        barrier.abort()
        return
    buf = ctypes.create_string_buffer(args.size)
    ptr = ctypes.addressof(buf)
    if store.register_buffer(ptr, args.size) != 0:
        results.put((idx, None, "register_buffer failed"))
        barrier.abort()
        return
    if args.op == "put":
        keys = [f"{args.prefix}-put-w{idx}-{k}" for k in range(args.keys)]
        ctypes.memmove(ptr, _pattern(args.size, idx), args.size)
    else:
        keys = [f"{args.prefix}-get-{k}" for k in range(args.keys)]
        expected = {k: _pattern(args.size, i) for i, k in enumerate(keys)} if args.verify else {}
        # Worker 0 stores the shared working set; the others wait at the barrier.
        if idx == 0:
            for i, k in enumerate(keys):
                ctypes.memmove(ptr, _pattern(args.size, i), args.size)
                if store.upsert_from(k, ptr, args.size) != 0:
                    results.put((idx, None, f"filling {k} failed"))
                    barrier.abort()
                    return
    try:
        barrier.wait(timeout=120)
    except Exception:  # another worker failed its setup
        results.put((idx, None, "barrier broken"))
        return

    lat = []
    errors = 0
    n = len(keys)
    i = idx % n
    t0 = time.perf_counter()
    deadline = t0 + args.duration
    now = t0
    while now < deadline:
        k = keys[i]
        i = i + 1 if i + 1 < n else 0
        if args.op == "put":
            ok = store.upsert_from(k, ptr, args.size) == 0
        else:
            got = store.get_into(k, ptr, args.size)
            ok = got == args.size
            if ok and args.verify:
                ok = ctypes.string_at(ptr, args.size) == expected[k]
        t = time.perf_counter()
        lat.append(t - now)
        errors += 0 if ok else 1
        now = t
    elapsed = now - t0
    store.close()
    results.put((idx, (lat, errors, elapsed), None))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("op", choices=["put", "get"])
    p.add_argument("--master", default="127.0.0.1:50051", help="mooncake_master RPC HOST:PORT")
    p.add_argument("--metadata", default="http://127.0.0.1:8080/metadata",
                   help="metadata server (the master's --enable_http_metadata_server URL)")
    p.add_argument("--host", default="127.0.0.1", help="local hostname the workers register")
    p.add_argument("--size", type=int, default=2 << 20, help="value bytes")
    p.add_argument("--clients", type=int, default=4, help="worker processes")
    p.add_argument("--duration", type=float, default=5.0, help="seconds to run")
    p.add_argument("--keys", type=int, default=32,
                   help="get: shared working set; put: keys per worker")
    p.add_argument("--prefix", default="bench", help="key prefix")
    p.add_argument("--verify", action="store_true", help="get: compare every byte")
    args = p.parse_args()
    if args.clients < 1 or args.size < 1 or args.keys < 1 or args.duration <= 0:
        p.error("--clients, --size, --keys and --duration must be positive")

    ctx = mp.get_context("spawn")  # a fresh interpreter per worker: no forked store state
    barrier = ctx.Barrier(args.clients)
    results = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(i, args, barrier, results))
             for i in range(args.clients)]
    for pr in procs:
        pr.start()
    lat, errors, elapsed, failed = [], 0, 0.0, []
    for _ in procs:
        try:
            idx, res, err = results.get(timeout=args.duration + 300)
        except Exception:
            failed.append("a worker did not report")
            break
        if err:
            failed.append(f"worker {idx}: {err}")
            continue
        lat.extend(res[0])
        errors += res[1]
        elapsed = max(elapsed, res[2])
    for pr in procs:
        pr.join(timeout=30)
        if pr.is_alive():
            pr.terminate()
    if failed:
        for f in failed:
            print(f"mooncake_peer: {f}", file=sys.stderr)
        return 1
    lat.sort()
    count = len(lat)

    def pct(q):
        return lat[min(count - 1, int(q * count))] * 1e3 if count else 0.0

    ops = count / elapsed if elapsed > 0 else 0.0
    print(f"value {args.size} bytes, {args.clients} worker processes, {args.keys} keys, "
          f"protocol tcp")
    print(f"{'op':<8} {'count':>10} {'ops/s':>10} {'GB/s':>8} {'p50_ms':>9} {'p99_ms':>9} "
          f"{'max_ms':>9}  errors")
    print(f"{args.op:<8} {count:>10} {ops:>10.1f} {ops * args.size / 1e9:>8.3f} {pct(0.5):>9.3f} "
          f"{pct(0.99):>9.3f} {pct(1.0) if count else 0.0:>9.3f}  {errors}")
    print(f"elapsed {elapsed:.2f}s")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
