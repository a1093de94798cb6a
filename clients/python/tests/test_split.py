"""Split budgets: shares that sum exactly to the limit, keys spread over the slots, two choices."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from typing import TypeVar

import pytest
from valkey.crc import key_slot

from valkey_ratelimit import (
    AsyncRateLimiter,
    AsyncSplitLimit,
    BatchOptions,
    Gcra,
    RateLimiter,
    SlidingLog,
    SplitLimit,
    TokenBucket,
    Window,
    shard_keys,
    split_limit,
)
from valkey_ratelimit.split import shares

T = TypeVar("T")


def test_shares_sum_exactly_and_differ_by_at_most_one() -> None:
    rng = random.Random(7)
    for _ in range(500):
        n = rng.randint(1, 50)
        total = rng.randint(n, 10_000)
        parts = shares(total, n)
        assert sum(parts) == total and len(parts) == n and max(parts) - min(parts) <= 1
    with pytest.raises(ValueError):
        shares(2, 3)


def test_every_algorithm_splits_into_limits_that_sum_to_its_own() -> None:
    bucket = split_limit(TokenBucket(100, 7, "1s"), 3)
    assert [(b.capacity, b.refill_amount) for b in bucket if isinstance(b, TokenBucket)] == [
        (34, 3),
        (33, 2),
        (33, 2),
    ]
    gcra = split_limit(Gcra(10, 100, "1s"), 4)
    assert sum(g.burst for g in gcra if isinstance(g, Gcra)) == 10
    assert sum(g.rate for g in gcra if isinstance(g, Gcra)) == 100
    windows = split_limit(Window(1001, "1m", sliding=True), 10)
    assert sum(w.limit for w in windows if isinstance(w, Window)) == 1001
    assert all(isinstance(w, Window) and w.sliding for w in windows)
    logs = split_limit(SlidingLog(5, "1h", count_denied=True), 5)
    assert all(isinstance(s, SlidingLog) and s.limit == 1 and s.count_denied for s in logs)


def test_shard_keys_fall_in_distinct_slot_ranges() -> None:
    for n in (2, 3, 10):
        keys = shard_keys("rl:api:global", n)
        slots = [key_slot(k.encode()) for k in keys]
        assert [s * n // 16384 for s in slots] == list(range(n))
    assert shard_keys("a", 3) != shard_keys("b", 3)
    with pytest.raises(ValueError):
        shard_keys("rl:{user}:x", 3)


class FirstTwo(random.Random):
    """Always picks shard 0, then shard 1."""

    def sample(self, population: Sequence[T], k: int, **_: object) -> list[T]:
        return [population[0], population[1]]


def test_a_denied_first_pick_is_served_by_the_second_and_only_two_are_tried(limiter: RateLimiter) -> None:
    split = SplitLimit(limiter, "two", Window(7, "1h"), 3, rng=FirstTwo())  # shares 3, 2, 2
    assert [split.hit().allowed for _ in range(3)] == [True, True, True]
    assert not limiter.hit(split.keys[0], split.limits[0], dry_run=True).allowed  # shard 0 is out
    second = split.hit()
    assert second.allowed and second.limit == 7
    assert split.hit().allowed
    denied = split.hit()  # shards 0 and 1 are out; shard 2 still has 2, but only two are tried
    assert not denied.allowed and denied.retry_after_ms > 0


def test_split_never_admits_more_than_the_limit(limiter: RateLimiter) -> None:
    split = SplitLimit(limiter, "s", Window(10, "1h"), 3, rng=random.Random(1))
    results = [split.hit() for _ in range(60)]
    assert sum(r.allowed for r in results) == 10
    states = [limiter.inspect(k) for k in split.keys]
    assert sum(int(state["current"]) for state in states if state is not None) == 10


def used(limiter: RateLimiter, keys: Sequence[str]) -> int:
    states = [limiter.inspect(k) for k in keys]
    return sum(int(state["current"]) for state in states if state is not None)


def test_split_with_batching_admits_exactly_the_limit_in_fewer_calls(limiter: RateLimiter) -> None:
    options = BatchOptions(min_batch=5, background=False)
    with SplitLimit(limiter, "sb", Window(60, "1h"), 3, rng=random.Random(2), batching=options) as split:
        results = [split.hit() for _ in range(300)]
        assert sum(r.allowed for r in results) == 60
        assert {r.limit for r in results} == {60}
        assert sum(b.stats.server_calls for b in split.batchers) < 60 / 2
    assert used(limiter, split.keys) == 60


def test_split_with_batching_spends_held_units_before_taking_from_another_share(limiter: RateLimiter) -> None:
    options = BatchOptions(min_batch=10, background=False)
    with SplitLimit(limiter, "hp", Window(90, "1h"), 3, batching=options) as split:
        assert all(split.hit().allowed for _ in range(10))
        assert sum(b.stats.takes for b in split.batchers) == 1 and sum(b.held for b in split.batchers) == 0
        assert split.hit(2).allowed
        assert sum(b.stats.takes for b in split.batchers) == 2 and sum(b.held for b in split.batchers) == 8
        assert used(limiter, split.keys) == 20
    assert used(limiter, split.keys) == 12  # closing gave the 8 back


@pytest.mark.parametrize(
    ("limit", "error"), [(Window(30, "1m", sliding=True), ValueError), (SlidingLog(30, "1m"), TypeError)]
)
def test_split_with_batching_refuses_sliding_limits(
    limiter: RateLimiter, limit: Window | SlidingLog, error: type[Exception]
) -> None:
    with pytest.raises(error, match="batch"):
        SplitLimit(limiter, "r", limit, 3, batching=BatchOptions(background=False))


async def test_async_split_never_admits_more_than_the_limit(aconnect: Callable[[], AsyncRateLimiter]) -> None:
    split = AsyncSplitLimit(aconnect(), "as", Window(10, "1h"), 3, rng=random.Random(1))
    results = [await split.hit() for _ in range(60)]
    assert sum(r.allowed for r in results) == 10


async def test_async_split_with_batching_and_many_coroutines_admits_exactly_the_limit(
    aconnect: Callable[[], AsyncRateLimiter],
) -> None:
    limiter = aconnect()
    options = BatchOptions(min_batch=5, background=False)
    async with AsyncSplitLimit(limiter, "asb", Window(90, "1h"), 3, rng=random.Random(5), batching=options) as split:

        async def spend() -> int:
            admitted = 0
            for _ in range(20):
                admitted += (await split.hit()).allowed
            return admitted

        assert sum(await asyncio.gather(*(spend() for _ in range(30)))) == 90
        assert sum(b.stats.server_calls for b in split.batchers) < 90 / 2
    states = [await limiter.inspect(k) for k in split.keys]
    assert sum(int(state["current"]) for state in states if state is not None) == 90
