"""The failure policy: an unreachable or silent server, and errors that are never swallowed."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import valkey
import valkey.asyncio as avalkey
from servers import Server, free_port

from valkey_ratelimit import (
    AsyncRateLimiter,
    RateLimiter,
    TokenBucket,
    UnavailableError,
    WrongTypeError,
    connect,
)

SPEC = TokenBucket(5, 1, "1s")


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers: a hung server."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield listener.getsockname()[1]


def test_unreachable_server_fails_open_closed_or_raises() -> None:
    url = f"valkey://127.0.0.1:{free_port()}"
    opened = RateLimiter(connect(url), on_unavailable="open").hit("k", SPEC)
    assert opened.allowed and opened.degraded and opened.headers() == {}
    closed = RateLimiter(connect(url), on_unavailable="closed").hit("k", SPEC)
    assert not closed.allowed and closed.degraded and closed.headers() == {"Retry-After": "1"}
    with pytest.raises(UnavailableError):
        RateLimiter(connect(url)).hit("k", SPEC)


def test_a_hung_server_costs_the_timeout(silent_port: int) -> None:
    limiter = RateLimiter(connect(f"valkey://127.0.0.1:{silent_port}", timeout=0.1), on_unavailable="open")
    result = limiter.all([("a", SPEC), ("b", SPEC)])
    assert result.allowed and all(r.degraded for r in result.limiters)


async def test_async_timeout_bounds_the_whole_call(silent_port: int) -> None:
    client = avalkey.Valkey(host="127.0.0.1", port=silent_port)
    limiter = AsyncRateLimiter(client, on_unavailable="closed", timeout=0.1)
    lease = await limiter.lease("k", 1, "1s")
    assert not lease.allowed and lease.degraded
    strict = AsyncRateLimiter(client, timeout=0.1)
    with pytest.raises(UnavailableError):
        await strict.hit("k", SPEC)
    await client.aclose()


def test_errors_about_the_call_are_never_swallowed(server: Server) -> None:
    server.client.set("str", "x")
    limiter = RateLimiter(valkey.Valkey("127.0.0.1", server.port), on_unavailable="open")
    with pytest.raises(WrongTypeError, match="WRONGTYPE"):
        limiter.hit("str", SPEC)


def test_block_needs_a_longer_socket_timeout(server: Server) -> None:
    limiter = RateLimiter(connect(f"valkey://127.0.0.1:{server.port}", timeout=0.5))
    with pytest.raises(ValueError, match="socket_timeout"):
        limiter.hit("k", SPEC, block="2s")


def test_bad_policy_name() -> None:
    with pytest.raises(ValueError, match="on_unavailable"):
        RateLimiter(valkey.Valkey(), on_unavailable="maybe")  # type: ignore[arg-type]
