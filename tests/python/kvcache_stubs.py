"""The kvcache.v1 Python stubs the build generates from proto/, for the
independent Python clients (client_test.py, tests/integration/security_test.py).

load(path) imports them from `path` (build/tests/python/gen) and returns one
object with the modules as attributes: pb (kvcache.proto's messages), admin
(admin.proto's), cache_grpc and admin_grpc (the service stubs).

xxh3_64() returns XXH3-64, the checksum kvcached records for every block, and
block_checksums() the list an AppendHeader carries: the daemon refuses appends
without them (security.require_block_checksums), and the clients verify every
fetched block with it. There is no fallback: without libxxhash they fail.
"""

import ctypes
import sys

# Debian's libxxhash0 (a dependency of libxxhash-dev, which
# deploy/setup-debian.sh installs).
XXHASH_LIBRARIES = ("libxxhash.so.0", "libxxhash.so")


def xxh3_64(names=XXHASH_LIBRARIES):
    """XXH3-64 of a bytes-like object, from the first of `names` that loads.
    Raises RuntimeError when none does."""
    for name in names:
        try:
            fn = ctypes.CDLL(name).XXH3_64bits
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_uint64
        fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        return lambda data: fn(bytes(data), len(data))
    raise RuntimeError(
        f"libxxhash is missing (none of {', '.join(names)} loads; apt-get install libxxhash0, "
        "or run deploy/setup-debian.sh): without XXH3-64 appends cannot carry block_checksums "
        "and fetched blocks cannot be verified")


def block_checksums(xxh3, kv, block_bytes):
    """The XXH3-64 of each whole `block_bytes` block of `kv`, in order."""
    return [xxh3(kv[o : o + block_bytes]) for o in range(0, len(kv) - block_bytes + 1, block_bytes)]


def load(path):
    sys.path.insert(0, path)
    from kvcache.v1 import admin_pb2, admin_pb2_grpc, kvcache_pb2, kvcache_pb2_grpc

    class Stubs:
        pb = kvcache_pb2
        admin = admin_pb2
        cache_grpc = kvcache_pb2_grpc
        admin_grpc = admin_pb2_grpc

    return Stubs
