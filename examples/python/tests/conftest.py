"""Fixtures: a real valkey-server with the module (started by test.sh), apps, HTTP clients."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import socketserver
import threading
import uuid
from dataclasses import replace

import httpx
import pytest
import valkey

from app import create_app
from rate_limit import RateLimitConfig


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def valkey_addr() -> str:
    addr = os.environ.get("RL_TEST_VALKEY_ADDR")
    if not addr:
        pytest.exit("RL_TEST_VALKEY_ADDR is not set: run ./test.sh, which starts valkey-server with the module", 2)
    return addr


@pytest.fixture(scope="session")
def store(valkey_addr: str) -> valkey.Valkey:
    """A plain client for looking at keys from the tests."""
    host, _, port = valkey_addr.rpartition(":")
    return valkey.Valkey(host=host, port=int(port), decode_responses=True)


@pytest.fixture
def prefix() -> str:
    # Each test has its own keys, so one server serves the whole run.
    return f"rl:test:{uuid.uuid4().hex[:12]}:api"


@pytest.fixture
def config(valkey_addr: str, prefix: str) -> RateLimitConfig:
    """The limits the tests start from: a slow refill (burst 5, 5 per 60 s: one
    token per 12 s), so no token comes back however loaded the machine. The
    timeout is generous here (a loaded machine must not turn a slow answer into
    a failure); the failure tests use the real 50 ms."""
    return RateLimitConfig(valkey_addr=valkey_addr, prefix=prefix, key_burst=5, key_rate=5, key_period=60,
                           ip_limit=20, ip_period=60, timeout_ms=1000)


@pytest.fixture
async def http(config: RateLimitConfig):
    """http(peer="127.0.0.1", **config overrides) -> an httpx.AsyncClient calling a fresh app
    in process, as if from `peer` (the ASGI transport lets the tests choose the peer address)."""
    apps = []

    def make(peer: str = "127.0.0.1", **overrides) -> httpx.AsyncClient:
        app = create_app(replace(config, **overrides))
        apps.append(app)
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=(peer, 40000)), base_url="http://app")

    yield make
    for app in apps:  # the ASGI transport runs no lifespan: close the apps' clients here
        await app.state.valkey.aclose()


@pytest.fixture
def dead_addr() -> str:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"127.0.0.1:{port}"


@pytest.fixture
def hung_addr():
    """A port that accepts connections (the kernel completes the handshake)
    and never answers: a Valkey that hangs."""
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield f"127.0.0.1:{s.getsockname()[1]}"


class Proxy:
    """A TCP proxy in front of the real Valkey, to play one that stalls.

    New connections are forwarded to the real server (mode "forward") or
    accepted and never answered (mode "hang"); blackhole() makes every
    connection open so far stop forwarding, both ways, without closing it: a
    Valkey gone behind a dead route, or a connection a failover left behind.
    """

    def __init__(self, target: str, mode: str = "hang") -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.mode = mode
        self._conns: list[dict] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            conn = {"socks": [client], "live": True}
            self._conns.append(conn)
            if self.mode == "forward":
                upstream = socket.create_connection(self.target)
                conn["socks"].append(upstream)
                for src, dst in ((client, upstream), (upstream, client)):
                    threading.Thread(target=self._pump, args=(src, dst, conn), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, conn: dict) -> None:
        try:
            while data := src.recv(65536):
                if conn["live"]:
                    dst.sendall(data)  # else swallowed: the connection is black-holed
        except OSError:
            pass

    def blackhole(self) -> None:
        for conn in self._conns:
            conn["live"] = False

    def close(self) -> None:
        self._listener.close()
        for conn in self._conns:
            for s in conn["socks"]:
                s.close()


@pytest.fixture
def proxy(valkey_addr: str):
    p = Proxy(valkey_addr)
    yield p
    p.close()


@pytest.fixture
def stalled_addr():
    """A server that answers the connection handshake (CLIENT SETINFO, ...) and
    then never answers RL.ALL: a Valkey that stops responding mid-connection,
    where only the command timeout helps."""

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            while data := self.request.recv(65536):
                for cmd in re.split(rb"(?=\*\d+\r\n\$)", data):
                    if cmd and b"RL.ALL" not in cmd.upper():
                        self.request.sendall(b"+OK\r\n")

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
