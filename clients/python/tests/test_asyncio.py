"""The asyncio client, standalone and cluster, against a real server."""

from __future__ import annotations

import asyncio
import time

import pytest

from valkey_ratelimit import (
    AsyncRateLimiter,
    CommandError,
    Gcra,
    LeaseNotGrantedError,
    Policy,
    SlidingLog,
    TokenBucket,
    Window,
    same_slot,
)


async def test_hits_and_headers(alimiter: AsyncRateLimiter) -> None:
    spec = SlidingLog(2, "1m")
    results = [await alimiter.hit("a", spec) for _ in range(3)]
    assert [r.allowed for r in results] == [True, True, False]
    assert results[-1].headers()["Retry-After"] == str(-(-results[-1].retry_after_ms // 1000))


async def test_all_throttle_peek_inspect_refund(alimiter: AsyncRateLimiter) -> None:
    keys = same_slot("t", "x", "y")
    result = await alimiter.all([(keys[0], Window(1, "1m")), (keys[1], Gcra(1, 1, "1m"))], partial=True, cost=2)
    assert result.allowed and result.granted == 1
    assert (await alimiter.throttle("th", 0, 1, "1m")).allowed
    assert (await alimiter.cl_throttle("th", 0, 1, 60)).limited  # the same GCRA key: now limited
    await alimiter.hit("r", TokenBucket(4, 1, "1h"), cost=3)
    assert (await alimiter.refund("r", 2)) is not None
    peek = await alimiter.peek("r")
    assert peek is not None and peek.remaining == 3
    state = await alimiter.inspect(keys[0])
    assert state is not None and state["algorithm"] == "window" and state["current"] == 1


async def test_lockout_unlock_and_errors(alimiter: AsyncRateLimiter) -> None:
    spec = Window(1, "1h")
    await alimiter.hit("l", spec, lockout="1m")
    assert not (await alimiter.hit("l", spec, lockout="1m")).allowed
    assert await alimiter.unlock("l")
    with pytest.raises(CommandError, match="COST must be an integer"):
        await alimiter.hit("l", spec, cost=-1)


async def test_policies(alimiter: AsyncRateLimiter) -> None:
    await alimiter.policy_set("p", TokenBucket(1, 1, "1m"))
    assert await alimiter.policy_get("p") == TokenBucket(1, 1, 60)
    assert await alimiter.policy_list() == ["p"]
    assert (await alimiter.hit("pk", Policy("p"))).allowed
    assert not (await alimiter.hit("pk", Policy("p"))).allowed
    assert await alimiter.policy_del("p") == 1


async def test_block_waits_and_hold_extends(alimiter: AsyncRateLimiter) -> None:
    spec = Gcra(1, 5, "1s")
    assert (await alimiter.hit("b", spec)).allowed
    start = time.monotonic()
    assert (await alimiter.hit("b", spec, block="2s")).allowed
    assert 0.1 < time.monotonic() - start < 1.5

    async with alimiter.hold("jobs", 1, "300ms") as lease:
        assert lease.lease_id is not None
        await asyncio.sleep(0.7)
        with pytest.raises(LeaseNotGrantedError):
            async with alimiter.hold("jobs", 1, "300ms"):
                pass
    # Released at the end: a waiting lease gets the slot at once.
    start = time.monotonic()
    waited = await alimiter.lease("jobs", 1, "1s", block="1s")
    assert waited.allowed and time.monotonic() - start < 0.5
