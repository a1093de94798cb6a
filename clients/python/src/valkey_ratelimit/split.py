"""Split budgets: one limit as N keys in N slots, so N primaries of a cluster share its load.

One key lives on one primary, so one limit is capped by one node's main
thread. Splitting it into ``n`` keys, each with ``1/n`` of the limit (the
remainder given out one by one, so the shares sum exactly to the limit), and
spreading the keys over the slot space puts them on different primaries
(envoy divides a bucket among instances the same way). The shares' limits sum
to the limit, so over every window the total admitted never exceeds it, for
every algorithm.

A request goes to a shard picked at random; when that shard denies it, to a
second one (two choices), so a shard that ran out early costs little. What
it gives up: a request denied by both its picks while a third shard still has
units is denied (utilisation below 1 when the demand is near the limit), a
request costing more than one share can never pass, and each shard refills
on its own.
"""

from __future__ import annotations

import dataclasses
import random
import zlib

from valkey.crc import key_slot

from .client import RateLimiter
from .limiters import Algorithm, Gcra, SlidingLog, TokenBucket, Window, limit_size
from .results import Result

SLOTS = 16384


def shares(total: int, n: int) -> list[int]:
    """``total`` in ``n`` integer parts that sum to it, the larger first (they differ by at most 1)."""
    if n < 1 or total < n:
        raise ValueError(f"cannot split {total} into {n} shares of at least 1")
    base, extra = divmod(total, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def split_limit(limit: Algorithm, n: int) -> list[Algorithm]:
    """``limit`` as ``n`` limiters whose limits (and rates) sum exactly to its own."""
    if isinstance(limit, TokenBucket):
        return [
            TokenBucket(c, r, limit.refill_period)
            for c, r in zip(shares(limit.capacity, n), shares(limit.refill_amount, n), strict=True)
        ]
    if isinstance(limit, Gcra):
        return [Gcra(b, r, limit.period) for b, r in zip(shares(limit.burst, n), shares(limit.rate, n), strict=True)]
    if isinstance(limit, Window):
        return [Window(s, limit.period, limit.sliding) for s in shares(limit.limit, n)]
    if isinstance(limit, SlidingLog):
        return [SlidingLog(s, limit.period, limit.count_denied) for s in shares(limit.limit, n)]
    raise TypeError(f"cannot split {type(limit).__name__}")


def shard_keys(key: str, n: int) -> list[str]:
    """``n`` keys for ``key``, the i-th in a slot near the middle of the i-th of ``n`` equal slot ranges.

    A cluster whose primaries own equal contiguous ranges (as ``valkey-cli
    --cluster create`` assigns them) then holds shard i on primary ``i * m //
    n`` of its ``m``; with ``n`` a multiple of ``m``, every primary gets
    ``n / m`` shards. The hash tag is a digest of ``key`` and a counter found
    by search, so different keys use different slots.
    """
    if "{" in key or "}" in key:
        raise ValueError(f"a split key carries its own hash tag; braces would override it: {key!r}")
    digest = f"{zlib.crc32(key.encode()):08x}"
    width = SLOTS / n
    keys = []
    for i in range(n):
        low, high = (i + 0.25) * width, (i + 0.75) * width
        j = 0
        while not low <= key_slot(f"{{{digest}.{i}.{j}}}".encode()) < high:
            j += 1
        keys.append(f"{key}:{{{digest}.{i}.{j}}}")
    return keys


class SplitLimit:
    """``limit`` on ``key``, split over ``shards`` keys on different slots: ``hit`` like ``RateLimiter.hit``.

    Give ``limiter`` a ``DenyCache`` and a shard's denial is remembered per
    shard, so once every shard is out, requests are denied without a call.
    """

    def __init__(
        self,
        limiter: RateLimiter,
        key: str,
        limit: Algorithm,
        shards: int,
        *,
        rng: random.Random | None = None,
    ) -> None:
        self.limiter = limiter
        self.limit = limit
        self.keys = shard_keys(key, shards)
        self.limits = split_limit(limit, shards)
        self.total = sum(limit_size(lim) for lim in self.limits)
        self.rng = rng or random.Random()

    def hit(self, cost: int = 1, *, name: str = "default") -> Result:
        """A request of ``cost`` on a random shard, then on a second one if the first denies it.

        The result is the answering shard's, with ``limit`` the whole limit:
        ``remaining`` is that shard's. On two denials, the one that frees sooner.
        """
        first, second = self._picks()
        result = self._hit(first, cost, name)
        if result.allowed or second is None:
            return result
        other = self._hit(second, cost, name)
        if other.allowed:
            return other
        return min(result, other, key=lambda r: r.retry_after_ms if r.retry_after_ms >= 0 else float("inf"))

    def _picks(self) -> tuple[int, int | None]:
        if len(self.keys) == 1:
            return 0, None
        first, second = self.rng.sample(range(len(self.keys)), 2)
        return first, second

    def _hit(self, shard: int, cost: int, name: str) -> Result:
        result = self.limiter.hit(self.keys[shard], self.limits[shard], cost=cost, name=name)
        return dataclasses.replace(result, limit=self.total)
