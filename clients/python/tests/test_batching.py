"""Token batching against a real server: never more than the limit, units given back, adaptive size."""

from __future__ import annotations

import threading
import time

import pytest

from valkey_ratelimit import Policy, RateLimiter, SlidingLog, TokenBatcher, TokenBucket, Window


class FakeClock:
    """Starts at the real monotonic clock (the server's windows are real) and moves only when told."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


def used(limiter: RateLimiter, key: str) -> int:
    state = limiter.inspect(key)
    return 0 if state is None else int(state["current"])


def test_threads_sharing_batchers_admit_exactly_the_limit(limiter: RateLimiter) -> None:
    """Three batchers (three processes' worth), two threads each, spend until denied: exactly the
    limit is admitted (no unit left stranded, none too many), in far fewer server calls."""
    limit = Window(300, "1h")
    batchers = [TokenBatcher(limiter, "w", limit, max_batch=40, background=False) for _ in range(3)]
    admitted = [0] * 6

    def spend(i: int) -> None:
        while batchers[i // 2].acquire().allowed:
            admitted[i] += 1

    threads = [threading.Thread(target=spend, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for b in batchers:
        b.close()
    assert sum(admitted) == 300
    assert used(limiter, "w") == 300
    assert sum(b.stats.admitted for b in batchers) == 300
    assert sum(b.stats.server_calls for b in batchers) < 300 / 2


def test_close_gives_back_what_was_not_used(limiter: RateLimiter) -> None:
    with TokenBatcher(limiter, "c", Window(100, "1h"), min_batch=20, background=False) as batcher:
        assert batcher.acquire().allowed and batcher.acquire(3).allowed
        assert batcher.held == 16 and used(limiter, "c") == 20
    assert used(limiter, "c") == 4
    assert batcher.stats.refunded == 16
    with pytest.raises(RuntimeError):
        batcher.acquire()


def test_idle_units_go_back(limiter: RateLimiter) -> None:
    clock = FakeClock()
    batcher = TokenBatcher(limiter, "i", TokenBucket(100, 1, "1h"), min_batch=10, background=False, clock=clock)
    batcher.acquire()
    batcher.maintain()
    assert batcher.held == 9  # not idle yet
    clock.now += batcher.idle_after
    batcher.maintain()
    assert batcher.held == 0 and batcher.stats.refunded == 9
    remaining = limiter.peek("i")
    assert remaining is not None and remaining.remaining == 99


def test_fixed_window_units_expire_with_their_window_and_are_not_refunded_late(limiter: RateLimiter) -> None:
    clock = FakeClock()
    batcher = TokenBatcher(limiter, "f", Window(100, "1h"), min_batch=10, background=False, clock=clock)
    first = batcher.acquire()
    window_ends = clock.now + first.reset_after_ms / 1000
    # Inside the last refund_margin: a refund could land in the next window, so none is sent.
    clock.now = window_ends - batcher.refund_margin / 2
    batcher.flush()
    assert batcher.held == 9 and batcher.stats.refunds == 0
    # Past the window: the units may not be spent; they are dropped, and a new batch is taken.
    clock.now = window_ends
    takes = batcher.stats.takes
    batcher.acquire()
    assert batcher.stats.dropped == 9 and batcher.stats.takes == takes + 1


def test_a_window_last_stretch_takes_only_what_is_needed(limiter: RateLimiter) -> None:
    clock = FakeClock()
    batcher = TokenBatcher(limiter, "l", Window(100, "1h"), min_batch=10, background=False, clock=clock)
    first = batcher.acquire()
    clock.now += first.reset_after_ms / 1000 - batcher.refund_margin / 2
    for _ in range(9):
        assert batcher.acquire().local
    batcher.acquire(2)
    assert batcher.held == 0 and used(limiter, "l") == 12


def test_the_batch_follows_the_recent_rate_within_bounds(limiter: RateLimiter) -> None:
    clock = FakeClock()
    batcher = TokenBatcher(
        limiter, "a", Window(100_000, "1h"), target=0.2, max_batch=500, background=False, clock=clock
    )
    assert batcher.batch_size() == 1
    for _ in range(2000):  # 1000 per second for 2 s
        clock.now += 0.001
        batcher.acquire()
    assert 150 <= batcher.batch_size() <= 200  # about 0.2 s of 1000/s
    for _ in range(3000):  # 10,000 per second: capped
        clock.now += 0.0001
        batcher.acquire()
    assert batcher.batch_size() == 500
    assert batcher.stats.takes < 100


def test_a_server_denial_is_kept_locally_for_recheck(limiter: RateLimiter) -> None:
    clock = FakeClock()
    batcher = TokenBatcher(limiter, "d", Window(3, "1h"), background=False, clock=clock)
    assert [batcher.acquire().allowed for _ in range(3)] == [True, True, True]
    denied = batcher.acquire()
    assert not denied.allowed and not denied.local
    again = batcher.acquire()
    assert not again.allowed and again.local and again.retry_after_ms > 0
    limiter.refund("d", 2)  # given back elsewhere: seen after ``recheck``
    clock.now += batcher.recheck
    assert batcher.acquire().allowed


def test_a_cost_larger_than_the_batch_tops_up_exactly(limiter: RateLimiter) -> None:
    batcher = TokenBatcher(limiter, "t", TokenBucket(10, 1, "1h"), background=False)
    limiter.hit("t", TokenBucket(10, 1, "1h"), cost=7)
    denied = batcher.acquire(5)  # 3 there: taken, then the top-up of 2 is denied with its retry
    assert not denied.allowed and denied.retry_after_ms > 0
    assert batcher.held == 3
    assert batcher.acquire(3).allowed


@pytest.mark.parametrize("limit", [Window(10, "1m", sliding=True), SlidingLog(10, "1m"), Policy("p")])
def test_limits_that_cannot_be_batched_exactly_are_refused(limiter: RateLimiter, limit: object) -> None:
    with pytest.raises((ValueError, TypeError)):
        TokenBatcher(limiter, "x", limit, background=False)  # type: ignore[arg-type]


def test_the_background_thread_gives_idle_units_back(limiter: RateLimiter) -> None:
    with TokenBatcher(limiter, "b", TokenBucket(100, 1, "1h"), min_batch=10, target=0.05) as batcher:
        batcher.acquire()
        deadline = time.monotonic() + 10
        while batcher.held and time.monotonic() < deadline:
            time.sleep(0.01)
        assert batcher.held == 0 and batcher.stats.refunded == 9
