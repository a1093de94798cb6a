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
    token per 12 s), so no token comes back however loaded the machine."""
    return RateLimitConfig(valkey_addr=valkey_addr, prefix=prefix, key_burst=5, key_rate=5, key_period=60,
                           ip_limit=20, ip_period=60)


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
