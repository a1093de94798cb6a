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

With ``batching`` (``BatchOptions``), each share is spent through a batcher
of its own (``valkey_ratelimit.batching``; ``max_batch`` defaults to a tenth
of the share). Each batcher keeps its share as exactly as it keeps a whole
limit, so the sum still holds: fixed windows exact, token buckets and GCRA
at most ``rate * max_hold`` more per span in all. A request goes first to a
shard whose batcher holds enough units, else to one whose batcher is taking
a batch (it waits for that batch), else to a random one; on a denial, to a
second random shard. So a process serving one request at a time holds one
share's batch, and fewer than a request's cost on the others. Under-use:
besides what two choices miss, the units other processes hold, at most
``max_batch`` per share per process (one share's worth while requests come
one at a time), back when they are spent, idle, or at the window's refund
deadline.

The picks and the choice between two answers are written once, without I/O
(``_Shards``); ``SplitLimit`` and ``AsyncSplitLimit``
(``valkey_ratelimit.asyncio_split``) only send them.
"""

from __future__ import annotations

import dataclasses
import random
import zlib
from collections.abc import Generator, Sequence
from types import TracebackType

from valkey.crc import key_slot

from ._ledger import Batchable, BatchOptions, Ledger, batchable
from ._steps import run
from .batching import TokenBatcher
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


class _Shards:
    """What the sync and asyncio split limits share: the keys, the shares, which shards to try."""

    def __init__(self, key: str, limit: Algorithm, shards: int, rng: random.Random | None) -> None:
        self.limit = limit
        self.keys = shard_keys(key, shards)
        self.limits = split_limit(limit, shards)
        self.total = sum(limit_size(lim) for lim in self.limits)
        self.rng = rng or random.Random()

    def _plan(self, cost: int, ledgers: Sequence[Ledger]) -> Generator[int, Result, Result]:
        """Yields the shards to ask, is sent each one's answer; returns the request's."""
        first, second = self._picks(cost, ledgers)
        result = yield first
        if result.allowed or second is None:
            return result
        other = yield second
        if other.allowed:
            return other
        return min(result, other, key=lambda r: r.retry_after_ms if r.retry_after_ms >= 0 else float("inf"))

    def _picks(self, cost: int, ledgers: Sequence[Ledger]) -> tuple[int, int | None]:
        n = len(self.keys)
        if n == 1:
            return 0, None
        # Units already here, then a batch already coming: a new batch elsewhere would strand
        # this process's units on two shares.
        ready = [i for i, b in enumerate(ledgers) if b.held >= cost] or [i for i, b in enumerate(ledgers) if b.busy]
        if not ready:
            first, second = self.rng.sample(range(n), 2)
            return first, second
        first = self.rng.choice(ready)
        return first, (first + self.rng.randrange(1, n)) % n

    def _batchable(self) -> list[tuple[str, Batchable]]:
        return [(key, batchable(limit)) for key, limit in zip(self.keys, self.limits, strict=True)]

    def _as_whole(self, result: Result, name: str) -> Result:
        return dataclasses.replace(result, limit=self.total, name=name)


class SplitLimit(_Shards):
    """``limit`` on ``key``, split over ``shards`` keys on different slots: ``hit`` like ``RateLimiter.hit``.

    Give ``limiter`` a ``DenyCache`` and a shard's denial is remembered per
    shard, so once every shard is out, requests are denied without a call.
    Give ``batching`` and each share is spent through a ``TokenBatcher``:
    then use it as a context manager, or call ``close()``, so that unused
    units go back.
    """

    def __init__(
        self,
        limiter: RateLimiter,
        key: str,
        limit: Algorithm,
        shards: int,
        *,
        rng: random.Random | None = None,
        batching: BatchOptions | None = None,
    ) -> None:
        super().__init__(key, limit, shards, rng)
        self.limiter = limiter
        self.batchers: list[TokenBatcher] = []
        if batching is not None:
            self.batchers = [TokenBatcher(limiter, k, lim, **batching.keywords()) for k, lim in self._batchable()]

    def hit(self, cost: int = 1, *, name: str = "default") -> Result:
        """A request of ``cost`` on one shard, then on a second one if the first denies it.

        The result is the answering shard's, with ``limit`` the whole limit:
        ``remaining`` is that shard's. On two denials, the one that frees sooner.
        """
        return run(self._plan(cost, self.batchers), lambda shard: self._hit(shard, cost, name))

    def _hit(self, shard: int, cost: int, name: str) -> Result:
        if self.batchers:
            result = self.batchers[shard].acquire(cost)
        else:
            result = self.limiter.hit(self.keys[shard], self.limits[shard], cost=cost, name=name)
        return self._as_whole(result, name)

    def maintain(self) -> None:
        """Each batcher's ``maintain`` (with ``background=False``)."""
        for batcher in self.batchers:
            batcher.maintain()

    def flush(self) -> None:
        """Give back every unused unit of every share now."""
        for batcher in self.batchers:
            batcher.flush()

    def close(self) -> None:
        """Close every share's batcher, giving back what is left; idempotent."""
        for batcher in self.batchers:
            batcher.close()

    def __enter__(self) -> SplitLimit:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
