"""The kvcache.v1 Python stubs the build generates from proto/, for the
independent Python clients (client_test.py, tests/integration/security_test.py).

load(path) imports them from `path` (build/tests/python/gen) and returns one
object with the modules as attributes: pb (kvcache.proto's messages), admin
(admin.proto's), cache_grpc and admin_grpc (the service stubs).
"""

import sys


def load(path):
    sys.path.insert(0, path)
    from kvcache.v1 import admin_pb2, admin_pb2_grpc, kvcache_pb2, kvcache_pb2_grpc

    class Stubs:
        pb = kvcache_pb2
        admin = admin_pb2
        cache_grpc = kvcache_pb2_grpc
        admin_grpc = admin_pb2_grpc

    return Stubs
