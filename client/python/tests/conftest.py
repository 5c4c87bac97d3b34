"""pytest fixtures: the real kvcached on a temporary Unix socket, and clients of it.

The daemon binary comes from --kvcached (or $KVCACHED); tests/python/run_package_tests.sh
passes the build's. Without one the tests fail rather than skip.
"""

import os
import signal
import subprocess
import tempfile
import time

import pytest

import kvcache


def pytest_addoption(parser):
    parser.addoption("--kvcached", default=os.environ.get("KVCACHED", ""),
                     help="path of the kvcached binary to test against")


@pytest.fixture(scope="session")
def daemon(request):
    """A kvcached serving gRPC and shared memory on a temporary Unix socket.

    Yields a dict: socket (path), target ("unix://..."), proc, log (path).
    """
    binary = request.config.getoption("--kvcached")
    if not binary or not os.access(binary, os.X_OK):
        pytest.fail(f"no kvcached binary (--kvcached or $KVCACHED): {binary!r}")
    tmp = tempfile.mkdtemp(prefix="kvcache-py-")
    sock = os.path.join(tmp, "kvcached.sock")
    log_path = os.path.join(tmp, "kvcached.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [binary, "--listen", "none", "--unix-socket", sock, "--metrics-address", "none",
             "--capacity-bytes", str(256 << 20)],
            stdout=log, stderr=subprocess.STDOUT)
    info = {"socket": sock, "target": "unix://" + sock, "proc": proc, "log": log_path}
    deadline = time.monotonic() + 30
    while not (os.path.exists(sock) and os.path.exists(sock + ".shm")):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail("kvcached did not start:\n" + open(log_path).read())
        time.sleep(0.05)
    with kvcache.Client(info["target"]) as c:
        c.wait_for_ready(10)
    yield info
    assert proc.poll() is None, "kvcached died during the tests:\n" + open(log_path).read()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, open(log_path).read()


@pytest.fixture(params=["grpc", "shm"])
def data_path(request):
    return request.param


@pytest.fixture
def client(daemon, data_path):
    """A client of the daemon taking the data path under test."""
    with kvcache.Client(daemon["target"], data_path=data_path, timeout=20) as c:
        yield c
