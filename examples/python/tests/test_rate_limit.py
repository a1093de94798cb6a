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

from rate_limit import RateLimitConfig, client_ip, parse_networks
from valkey_ratelimit import AllResult as Decision
from valkey_ratelimit import Result

pytestmark = pytest.mark.anyio

KEY = {"X-API-Key": "key-a"}
# The failure tests' timeout, and the bound on every answer while Valkey
# fails: the whole call is cut at 2 * timeout; the margin is for the machine.
TIMEOUT_MS = 50
BOUND_S = (2 * TIMEOUT_MS + 150) / 1000


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


async def test_api_key_longer_than_256_bytes_is_401(http, store, prefix):
    c = http()
    r = await c.get("/api/hello", headers={"X-API-Key": "k" * 256})
    assert r.status_code == 200
    r = await c.get("/api/hello", headers={"X-API-Key": "k" * 257})
    assert r.status_code == 401
    assert r.json() == {"error": "API key too long"}
    assert "RateLimit" not in r.headers
    assert store.exists(f"{prefix}:key:{'k' * 256}") and not store.exists(f"{prefix}:key:{'k' * 257}")


async def test_repeated_api_key_header_uses_the_first(http, store, prefix):
    r = await http().get("/api/hello", headers=[("X-API-Key", "k1"), ("X-API-Key", "k2")])
    assert r.status_code == 200
    assert store.exists(f"{prefix}:key:k1")
    assert not store.keys(f"{prefix}:key:k1?*")  # not "k1,k2" or "k1, k2"


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


# ---- the header values of made-up replies (no server)

POLICY = '"key";q=5;w=60, "ip";q=20;w=60'


def Limiter(name, allowed, limit, remaining, retry_after_ms, reset_after_ms):  # noqa: N802 -- the old shape
    """One limiter's result as the package parses it from RL.ALL, with a 60 s window."""
    return Result(allowed, limit, remaining, retry_after_ms, reset_after_ms, name=name, window_seconds=60)


def denied(retry_after_ms: int, reset_after_ms: int = 60_000) -> Decision:
    """A 429 decided by the key's limiter (0 left), the IP's with room."""
    return Decision(False, retry_after_ms, (Limiter("key", False, 5, 0, retry_after_ms, reset_after_ms),
                                            Limiter("ip", True, 20, 10, 0, 30_000)))


@pytest.mark.parametrize("ms, want", [(1, "1"), (999, "1"), (1000, "1"), (1001, "2"), (11950, "12")])
def test_retry_after_is_rounded_up(ms, want):
    headers = denied(ms).headers(binding_only=True)
    assert headers["Retry-After"] == want
    assert str(denied(ms).retry_after_seconds) == want  # the 429 body's retry_after


@pytest.mark.parametrize("ms, want", [(0, "0"), (1, "1"), (1000, "1"), (59001, "60")])
def test_reset_is_rounded_up(ms, want):
    headers = denied(1000, reset_after_ms=ms).headers(binding_only=True)
    assert headers["RateLimit"] == f'"key";r=0;t={want}'
    assert headers["X-RateLimit-Reset"] == want


def test_headers_of_a_decision():
    d = Decision(True, 0, (Limiter("key", True, 5, 3, 0, 24_000), Limiter("ip", True, 20, 3, 0, 59_001)))
    assert list(d.headers(binding_only=True).items()) == [  # tie on remaining and wait: the longer reset, the IP's
        ("RateLimit-Policy", POLICY), ("RateLimit", '"ip";r=3;t=60'), ("X-RateLimit-Limit", "20"),
        ("X-RateLimit-Remaining", "3"), ("X-RateLimit-Reset", "60")]
    never = Decision(False, -1, (Limiter("key", False, 5, 0, 5_000, 60_000), Limiter("ip", False, 20, 0, -1, 0)))
    assert never.binding.name == "ip"  # -1 (never) is the longest wait
    assert never.retry_after_seconds is None and "Retry-After" not in never.headers()


def test_empty_environment_variables_are_unset():
    names = ["VALKEY_ADDR", "RL_PREFIX", "RL_KEY_BURST", "RL_KEY_RATE", "RL_KEY_PERIOD", "RL_IP_LIMIT",
             "RL_IP_PERIOD", "RL_TRUSTED_PROXIES", "RL_FAILURE_MODE", "RL_TIMEOUT_MS"]
    assert RateLimitConfig.from_env({n: "" for n in names}) == RateLimitConfig()
    assert RateLimitConfig.from_env({n: "  " for n in names}) == RateLimitConfig()
    assert RateLimitConfig.from_env({"RL_KEY_BURST": " 7 "}).key_burst == 7
    with pytest.raises(ValueError):
        RateLimitConfig.from_env({"RL_KEY_BURST": "0"})


# ---- failure policy

async def timed_get(c):
    start = time.monotonic()
    r = await c.get("/api/hello", headers=KEY)
    elapsed = time.monotonic() - start
    assert elapsed < BOUND_S, f"answered in {elapsed:.3f} s, bound {BOUND_S} s"
    return r


@pytest.mark.parametrize("target", ["dead_addr", "hung_addr", "stalled_addr"])
@pytest.mark.parametrize("mode", ["open", "closed"])
async def test_failure_policy(http, request, caplog, mode, target):
    """Nothing listens / the server accepts and hangs / it answers the handshake, then stops."""
    addr = request.getfixturevalue(target)
    c = http(valkey_addr=addr, failure_mode=mode, timeout_ms=TIMEOUT_MS)
    for _ in range(2):  # the second request shows a failed connection is not left hanging
        r = await timed_get(c)
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


async def test_a_stalled_connection_is_replaced(http, proxy):
    """A Valkey that accepts and never answers, then answers (a new connection
    reaches it); then the connection in use goes dead without being closed:
    each time, after a failure within the bound, a later request is decided."""

    async def until_decided() -> None:
        deadline = time.monotonic() + 3
        while "RateLimit" not in (await timed_get(c)).headers:
            assert time.monotonic() < deadline, "no decision 3 s after Valkey came back"
            await asyncio.sleep(0.05)

    c = http(valkey_addr=proxy.addr, timeout_ms=TIMEOUT_MS)  # fails open
    r = await timed_get(c)
    assert r.status_code == 200 and "RateLimit" not in r.headers
    proxy.mode = "forward"
    await until_decided()
    proxy.blackhole()
    r = await timed_get(c)
    assert r.status_code == 200 and "RateLimit" not in r.headers
    await until_decided()


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
