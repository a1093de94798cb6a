"""Token batching for asyncio against a real server: many coroutines, several clients, never over the limit."""

from __future__ import annotations

import asyncio
import inspect
import random
import time
from collections import Counter
from collections.abc import Callable

import pytest
from scale_run import SpendClock, window_of

from valkey_ratelimit import (
    AsyncRateLimiter,
    AsyncTokenBatcher,
    BatchOptions,
    Policy,
    SlidingLog,
    TokenBatcher,
    TokenBucket,
    Window,
)
from valkey_ratelimit.limiters import Limiter

Connect = Callable[[], AsyncRateLimiter]


class FakeClock:
    """Starts at the real monotonic clock (the server's windows are real) and moves only when told."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


async def used(limiter: AsyncRateLimiter, key: str) -> int:
    state = await limiter.inspect(key)
    return 0 if state is None else int(state["current"])


async def test_coroutines_on_several_clients_admit_exactly_the_limit(aconnect: Connect) -> None:
    """Three batchers on three clients (three processes' worth), ten coroutines each, spend until
    denied: exactly the limit is admitted (none twice, none stranded), in far fewer server calls."""
    limit = Window(300, "1h")
    batchers = [AsyncTokenBatcher(aconnect(), "w", limit, max_batch=40, background=False) for _ in range(3)]

    async def spend(batcher: AsyncTokenBatcher) -> int:
        admitted = 0
        for _ in range(1000):  # bounded: a batcher that spent units twice would never be denied
            if not (await batcher.acquire()).allowed:
                break
            admitted += 1
            await asyncio.sleep(0)  # let the other coroutines in between local spends
        return admitted

    admitted = await asyncio.gather(*(spend(b) for b in batchers for _ in range(10)))
    for b in batchers:
        await b.aclose()
    assert sum(admitted) == 300
    assert await used(batchers[0].limiter, "w") == 300
    assert sum(b.stats.admitted for b in batchers) == 300
    assert sum(b.stats.taken - b.stats.refunded for b in batchers) == 300
    assert sum(b.stats.server_calls for b in batchers) < 300 / 2


async def test_a_burst_of_coroutines_shares_one_fetch(aconnect: Connect) -> None:
    limiter = aconnect()
    async with AsyncTokenBatcher(limiter, "b", Window(1000, "1h"), min_batch=50, background=False) as batcher:
        results = await asyncio.gather(*(batcher.acquire() for _ in range(50)))
        assert all(r.allowed for r in results) and sum(not r.local for r in results) == 1
        assert batcher.stats.takes == 1 and batcher.held == 0
    assert await used(limiter, "b") == 50
    # Fewer units than coroutines: what was granted, once each, and the rest denied without a call each.
    async with AsyncTokenBatcher(limiter, "s", Window(30, "1h"), min_batch=50, background=False) as batcher:
        results = await asyncio.gather(*(batcher.acquire() for _ in range(50)))
        assert sum(r.allowed for r in results) == 30
        assert batcher.stats.takes == 2 and batcher.stats.denied_locally == 19
    assert await used(limiter, "s") == 30


async def test_short_windows_never_admit_more_than_the_limit(aconnect: Connect) -> None:
    """Real 250 ms windows, three clients of four coroutines each, demand 1.2 times the limit and
    batches of up to half of it, so units are still held when windows end. Each admission counts
    under the window it was spent in (``SpendClock``): a unit spent after its window shows."""
    period_ms = 250
    limit = Window(40, f"{period_ms}ms")
    clock = SpendClock()
    options = BatchOptions(min_batch=10, max_batch=20, target=1.0, refund_margin=0.05, clock=clock)
    batchers = [AsyncTokenBatcher(aconnect(), "sw", limit, **options.keywords()) for _ in range(3)]
    admitted: Counter[int] = Counter()
    rng = random.Random(23)
    end = time.monotonic() + 1.5
    interval = 12 / (1.2 * 40 * 1000 / period_ms)  # twelve coroutines, 1.2 times the limit

    async def spend(batcher: AsyncTokenBatcher) -> None:
        while time.monotonic() < end:
            result = await batcher.acquire()
            if result.allowed:
                admitted[window_of(result, clock.last_ms(), period_ms)] += 1
            await asyncio.sleep(interval * rng.uniform(0.5, 1.5))

    await asyncio.gather(*(spend(b) for b in batchers for _ in range(4)))
    for b in batchers:
        await b.aclose()
    assert max(admitted.values()) <= 40, dict(admitted)
    assert sum(admitted.values()) == sum(b.stats.admitted for b in batchers)
    assert len(admitted) >= 5 and sum(b.stats.refunded for b in batchers) > 0, dict(admitted)


async def test_close_gives_back_what_was_not_used(aconnect: Connect) -> None:
    limiter = aconnect()
    async with AsyncTokenBatcher(limiter, "c", Window(100, "1h"), min_batch=20, background=False) as batcher:
        assert (await batcher.acquire()).allowed and (await batcher.acquire(3)).allowed
        assert batcher.held == 16 and await used(limiter, "c") == 20
    assert await used(limiter, "c") == 4
    assert batcher.stats.refunded == 16
    with pytest.raises(RuntimeError, match="closed"):
        await batcher.acquire()
    await batcher.aclose()  # idempotent: nothing more goes back
    assert batcher.stats.refunds == 1


async def test_the_background_task_gives_idle_units_back(aconnect: Connect) -> None:
    limiter = aconnect()
    await limiter.peek("i")  # connected: a first reply slower than max_hold would be refunded at once
    async with AsyncTokenBatcher(limiter, "i", TokenBucket(100, 1, "1h"), min_batch=10, target=0.05) as batcher:
        await batcher.acquire()
        deadline = time.monotonic() + 10
        while batcher.held and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert batcher.held == 0 and batcher.stats.refunded == batcher.stats.taken - 1
        peek = await limiter.peek("i")
        assert peek is not None and peek.remaining == 99


async def test_maintain_refunds_idle_units_but_never_late_in_a_window(aconnect: Connect) -> None:
    limiter = aconnect()
    clock = FakeClock()
    bucket = AsyncTokenBatcher(limiter, "t", TokenBucket(100, 1, "1h"), min_batch=10, background=False, clock=clock)
    await bucket.acquire()
    await bucket.maintain()
    assert bucket.held == 9  # not idle yet
    clock.now += bucket.idle_after
    await bucket.maintain()
    peek = await limiter.peek("t")
    assert bucket.held == 0 and peek is not None and peek.remaining == 99

    window = AsyncTokenBatcher(limiter, "f", Window(100, "1h"), min_batch=10, background=False, clock=clock)
    first = await window.acquire()
    window_ends = clock.now + first.reset_after_ms / 1000
    clock.now = window_ends - window.refund_margin / 2  # a refund now could land in the next window
    await window.flush()
    assert window.held == 9 and window.stats.refunds == 0
    clock.now = window_ends
    await window.acquire()  # past the window: the 9 may not be spent; dropped, a new batch taken
    assert window.stats.dropped == 9 and window.stats.takes == 2


@pytest.mark.parametrize(
    ("limit", "error", "message"),
    [
        (Window(10, "1m", sliding=True), ValueError, "sliding window cannot be batched"),
        (SlidingLog(10, "1m"), TypeError, "cannot batch SlidingLog"),
        (Policy("p"), TypeError, "cannot batch Policy"),
    ],
)
async def test_limits_that_cannot_be_batched_exactly_are_refused(
    aconnect: Connect, limit: Limiter, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        AsyncTokenBatcher(aconnect(), "x", limit, background=False)  # type: ignore[arg-type]


async def test_a_cost_below_one_is_refused(aconnect: Connect) -> None:
    async with AsyncTokenBatcher(aconnect(), "z", Window(10, "1h"), background=False) as batcher:
        with pytest.raises(ValueError, match="at least 1"):
            await batcher.acquire(0)


def test_both_batchers_take_the_keywords_of_batch_options() -> None:
    """The defaults live in three signatures: they must agree."""
    expected = BatchOptions().keywords()
    for cls in (TokenBatcher, AsyncTokenBatcher):
        params = inspect.signature(cls).parameters
        assert {name: params[name].default for name in expected} == expected, cls.__name__
