"""What ``limits`` computes from the storage agrees with the module's own decision."""

from __future__ import annotations

import time

import pytest
from limits import RateLimitItemPerSecond
from limits.strategies import SlidingWindowCounterRateLimiter
from servers import Server

from valkey_ratelimit.limits import ValkeyRatelimitStorage

LIMIT, PERIOD = 5, 2


def until_window_phase(phase: float) -> None:
    """Sleep until `phase` seconds into the next epoch-aligned window."""
    time.sleep(PERIOD - time.time() % PERIOD + phase)


@pytest.mark.parametrize(
    ("first", "phase", "second"),
    [
        (LIMIT, 0.3, 0),  # full from the current window alone
        (LIMIT, 0.3, None),  # full in the previous window, some of it decayed
        (3, 0.5, 2),  # both windows, full
        (2, 0.5, 1),  # both windows, room left
        (LIMIT, 1.5, 1),  # the previous window mostly decayed
    ],
)
def test_sliding_window_stats_match_the_module(server: Server, first: int, phase: float, second: int | None) -> None:
    """`first` hits, then (`second` is None) wait `phase` into the next window, else hit `second`
    more at once; the remaining count and reset time limits reports are the module's."""
    server.client.flushall()
    storage = ValkeyRatelimitStorage(f"valkey-ratelimit://127.0.0.1:{server.port}")
    limiter = SlidingWindowCounterRateLimiter(storage)
    item = RateLimitItemPerSecond(LIMIT, PERIOD)
    until_window_phase(0.05)
    for _ in range(first):
        assert limiter.hit(item)
    if second is None:
        until_window_phase(phase)
    else:
        time.sleep(max(0.0, phase - time.time() % PERIOD))
        for _ in range(second):
            limiter.hit(item)

    key = storage.sliding_key(item.key_for())
    stats = limiter.get_window_stats(item)
    peek = server.client.execute_command("RL.WINDOW", key, LIMIT, f"{PERIOD}s", "SLIDING", "COST", 0, "DRYRUN")
    probe = server.client.execute_command("RL.WINDOW", key, LIMIT, f"{PERIOD}s", "SLIDING", "DRYRUN")
    assert stats.remaining == int(peek[2])
    assert limiter.test(item) == (int(probe[0]) == 1)
    if not int(probe[0]) and int(probe[3]) < PERIOD * 1000:
        # The reset is the moment the next hit fits (a few ms of round trips apart).
        assert stats.reset_time - time.time() == pytest.approx(int(probe[3]) / 1000, abs=0.05)
        time.sleep(max(0.0, stats.reset_time - time.time()) + 0.01)
        assert limiter.hit(item)
