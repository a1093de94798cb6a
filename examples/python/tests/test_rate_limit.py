"""The recipe's HTTP behaviour against a real valkey-server with the module (see examples/README.md)."""

from __future__ import annotations

import asyncio
import math
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

from rate_limit import client_ip, parse_networks

pytestmark = pytest.mark.anyio

KEY = {"X-API-Key": "key-a"}


async def test_allows_exactly_the_burst(http):
    c = http()
    statuses = [(await c.get("/api/hello", headers=KEY)).status_code for _ in range(7)]
    assert statuses == [200] * 5 + [429] * 2


async def test_headers_on_200(http):
    r = await http().get("/api/hello", headers=KEY)
    assert r.status_code == 200
    assert r.json() == {"message": "hello"}
    # burst 5 at 5 per 60 s: the GCRA's window is the 60 s it takes to earn 5 back
    assert r.headers["RateLimit-Policy"] == '"key";q=5;w=60, "ip";q=20;w=60'
    # the key (4 left) is more restrictive than the IP (19 left); one token takes 12 s
    assert r.headers["RateLimit"] == '"key";r=4;t=12'
    assert r.headers["X-RateLimit-Limit"] == "5"
    assert r.headers["X-RateLimit-Remaining"] == "4"
    assert r.headers["X-RateLimit-Reset"] == "12"
    assert "Retry-After" not in r.headers


async def test_headers_on_429(http):
    c = http()
    start = time.monotonic()
    for _ in range(5):
        assert (await c.get("/api/hello", headers=KEY)).status_code == 200
    r = await c.get("/api/hello", headers=KEY)
    slack = math.ceil(time.monotonic() - start)  # the server's clock moved at most this much
    assert r.status_code == 429
    assert r.headers["Content-Type"] == "application/json"
    retry = int(r.headers["Retry-After"])
    assert 12 - slack <= retry <= 12  # the next token, 12 s after the first request
    assert r.json() == {"error": "rate limited", "retry_after": retry}
    assert r.headers["RateLimit-Policy"] == '"key";q=5;w=60, "ip";q=20;w=60'
    name, r_, t = r.headers["RateLimit"].split(";")
    assert (name, r_) == ('"key"', "r=0")
    assert 60 - slack <= int(t.removeprefix("t=")) <= 60  # all 5 back 60 s after the first
    assert r.headers["X-RateLimit-Remaining"] == "0"
    assert r.headers["X-RateLimit-Limit"] == "5"
    assert r.headers["X-RateLimit-Reset"] == t.removeprefix("t=")


async def test_ip_limit_is_shared_across_keys(http, store, prefix):
    c = http(ip_limit=3)
    for i in range(3):
        assert (await c.get("/api/hello", headers={"X-API-Key": f"k{i}"})).status_code == 200
    r = await c.get("/api/hello", headers={"X-API-Key": "k3"})
    assert r.status_code == 429
    assert r.headers["RateLimit"].startswith('"ip";r=0;t=')
    assert r.headers["X-RateLimit-Limit"] == "3"
    assert r.headers["RateLimit-Policy"] == '"key";q=5;w=60, "ip";q=3;w=60'
    # All or nothing: the IP denied it, so the key's limiter was not charged.
    assert not store.exists(f"{prefix}:key:k3")


async def test_recovers_after_retry_after(http):
    c = http(key_burst=2, key_rate=2, key_period=1)  # one token every 500 ms
    for _ in range(20):  # on a loaded machine a token may come back meanwhile: go on until denied
        r = await c.get("/api/hello", headers=KEY)
        if r.status_code == 429:
            break
    assert r.status_code == 429
    retry = int(r.headers["Retry-After"])
    assert retry == 1  # 500 ms at most, rounded up
    await asyncio.sleep(retry)
    assert (await c.get("/api/hello", headers=KEY)).status_code == 200


async def test_api_keys_are_limited_separately(http):
    c = http()
    for _ in range(5):
        assert (await c.get("/api/hello", headers=KEY)).status_code == 200
    assert (await c.get("/api/hello", headers=KEY)).status_code == 429
    r = await c.get("/api/hello", headers={"X-API-Key": "key-b"})
    assert r.status_code == 200
    assert r.headers["X-RateLimit-Remaining"] == "4"


async def test_missing_api_key_is_401(http):
    c = http()
    for headers in ({}, {"X-API-Key": ""}):
        r = await c.get("/api/hello", headers=headers)
        assert r.status_code == 401
        assert r.json() == {"error": "missing API key"}
        assert "RateLimit" not in r.headers


async def test_forwarded_for_from_untrusted_peer_is_ignored(http, store, prefix):
    c = http(ip_limit=2)  # no trusted proxies: 127.0.0.1 is a client like any other
    for i, forged in enumerate(["198.51.100.1", "198.51.100.2", "198.51.100.3"]):
        r = await c.get("/api/hello", headers={"X-API-Key": f"k{i}", "X-Forwarded-For": forged})
    assert r.status_code == 429  # the three share the peer's IP limit
    assert store.exists(f"{prefix}:ip:127.0.0.1")
    assert not store.exists(f"{prefix}:ip:198.51.100.1")


async def test_forwarded_for_from_trusted_peer_is_used(http, store, prefix):
    c = http(peer="10.0.0.5", ip_limit=2, trusted_proxies=("10.0.0.0/8",))
    # The client wrote the left entry itself; our proxy appended the address it saw.
    chain = {"X-API-Key": "k1", "X-Forwarded-For": "198.51.100.9, 203.0.113.7"}
    assert (await c.get("/api/hello", headers=chain)).status_code == 200
    assert (await c.get("/api/hello", headers=chain)).status_code == 200
    assert (await c.get("/api/hello", headers=chain)).status_code == 429
    other = {"X-API-Key": "k1", "X-Forwarded-For": "203.0.113.8"}
    assert (await c.get("/api/hello", headers=other)).status_code == 200
    assert store.exists(f"{prefix}:ip:203.0.113.7")
    assert not store.exists(f"{prefix}:ip:198.51.100.9")
    assert not store.exists(f"{prefix}:ip:10.0.0.5")


def test_client_ip_rules():
    trusted = parse_networks(["10.0.0.0/8", "::1"])
    assert client_ip("192.0.2.1", "203.0.113.7", trusted) == "192.0.2.1"  # untrusted peer
    assert client_ip("10.1.1.1", None, trusted) == "10.1.1.1"  # trusted, no header
    assert client_ip("10.1.1.1", "203.0.113.7, 10.2.2.2", trusted) == "203.0.113.7"  # skips our proxies
    assert client_ip("10.1.1.1", "10.3.3.3, 10.2.2.2", trusted) == "10.3.3.3"  # all trusted: leftmost
    assert client_ip("10.1.1.1", "203.0.113.7, junk", trusted) == "10.1.1.1"  # garbage stops the walk
    assert client_ip("::ffff:192.0.2.1", None, trusted) == "192.0.2.1"  # IPv4-mapped
    assert client_ip("::1", "2001:DB8:0:0::1", trusted) == "2001:db8::1"  # canonical IPv6


@pytest.mark.parametrize("target", ["dead_addr", "hung_addr", "stalled_addr"])
@pytest.mark.parametrize("mode", ["open", "closed"])
async def test_failure_policy(http, request, caplog, mode, target):
    """Nothing listens / the server accepts and hangs / it answers the handshake, then stops."""
    addr = request.getfixturevalue(target)
    c = http(valkey_addr=addr, failure_mode=mode, timeout_ms=50)
    for _ in range(2):  # the second request shows a failed connection is not left hanging
        start = time.monotonic()
        r = await c.get("/api/hello", headers=KEY)
        elapsed = time.monotonic() - start
        assert elapsed < 0.5, f"answered in {elapsed:.3f} s"
        assert "RateLimit" not in r.headers and "X-RateLimit-Remaining" not in r.headers
        if mode == "open":
            assert r.status_code == 200 and r.json() == {"message": "hello"}
        else:
            assert r.status_code == 503
            assert r.headers["Retry-After"] == "1"
            assert r.json() == {"error": "rate limiter unavailable"}
    warnings = [rec for rec in caplog.records if rec.name == "rate_limit"]
    assert len(warnings) == 1, "one warning, then throttled"  # logged, not silent
    assert f"failing {mode}" in warnings[0].getMessage()


def test_real_server_from_environment(valkey_addr, store, prefix):
    """app.py as deployed: uvicorn, configured from the environment, over real HTTP."""
    port = free_port()
    env = {**os.environ, "VALKEY_ADDR": valkey_addr, "RL_PREFIX": prefix, "RL_KEY_BURST": "3",
           "RL_KEY_RATE": "3", "RL_KEY_PERIOD": "60"}
    recipe = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "app:app", "--host", "127.0.0.1", "--port", str(port)],
                            env=env, cwd=recipe)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{base}/healthz", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None, "uvicorn exited"
                assert time.monotonic() < deadline, "uvicorn did not start within 30 s"
                time.sleep(0.1)
        r = httpx.get(f"{base}/api/hello", headers=KEY)
        assert r.status_code == 200
        assert r.headers["RateLimit"] == '"key";r=2;t=20'
        assert r.headers["RateLimit-Policy"] == '"key";q=3;w=60, "ip";q=20;w=60'
        assert store.exists(f"{prefix}:ip:127.0.0.1")  # the real peer address
        assert httpx.get(f"{base}/healthz").headers.get("RateLimit") is None  # not limited
    finally:
        proc.terminate()
        proc.wait(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
