"""The bookkeeping of token batching, without I/O: ``TokenBatcher`` and ``AsyncTokenBatcher`` share it.

Every rule of ``valkey_ratelimit.batching`` (how much to take, what may be
spent and until when, what goes back and when, how long a denial is kept)
lives here, once. An operation is a generator: it yields what must be sent
to the server (``Take``, ``Refund``), is sent the reply (the ``Result`` of a
take, None after a refund) and returns its answer. The sync batcher sends
with ``RateLimiter``, the async one awaits ``AsyncRateLimiter``; each runs
an operation under its own lock from start to end, so one operation at a
time sees and changes the ledger, sends included.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from .limiters import Gcra, TokenBucket, Window, limit_size
from .results import Result

T = TypeVar("T")

#: The limiters a batch can be taken from.
Batchable = Window | TokenBucket | Gcra

SLIDING_REFUSED = (
    "a sliding window cannot be batched exactly (a unit spent after it was counted lets a sliding span "
    "admit up to a batch more): use a fixed Window, TokenBucket or Gcra"
)
KIND_REFUSED = (
    "cannot batch {kind}: sliding logs cannot be batched exactly and a policy's definition lives on the "
    "server; use a fixed Window, TokenBucket or Gcra"
)
CLOSED = "the batcher is closed"


@dataclass(frozen=True)
class BatchOptions:
    """How a batcher sizes, keeps and gives back its units; the keywords of ``TokenBatcher``.

    ``None`` for ``max_batch`` is a tenth of the limit; for ``idle_after``,
    ``max_hold`` and ``recheck`` it is ``target``. ``background``: refunds
    on idle and before deadlines by a thread (sync) or a task (asyncio).
    """

    target: float = 0.3
    min_batch: int = 1
    max_batch: int | None = None
    tau: float = 1.0
    idle_after: float | None = None
    refund_margin: float = 0.1
    max_hold: float | None = None
    recheck: float | None = None
    slack_ms: int = 2
    background: bool = True
    clock: Callable[[], float] = time.monotonic

    def keywords(self) -> dict[str, Any]:
        """As keyword arguments of a batcher (not ``asdict``: that would copy the clock)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass
class BatchStats:
    """What a batcher did: for the server calls per admitted request."""

    admitted: int = 0
    denied: int = 0
    denied_locally: int = 0
    #: Batch requests (``COST n PARTIAL``) and the exact top-ups near a window's end.
    takes: int = 0
    refunds: int = 0
    taken: int = 0
    refunded: int = 0
    #: Units that went stale unspent and could not be given back.
    dropped: int = 0

    @property
    def server_calls(self) -> int:
        return self.takes + self.refunds


@dataclass(frozen=True)
class Take:
    """``COST cost`` on the batcher's key and limit: ``PARTIAL`` for a batch, exact for a top-up."""

    cost: int
    partial: bool


@dataclass(frozen=True)
class Refund:
    """``RL.REFUND`` of ``amount`` on the batcher's key."""

    amount: int


#: An operation: yields what to send, is sent the reply (a Result for a Take, None for a Refund).
Steps = Generator[Take | Refund, Result | None, T]


def batchable(limit: object) -> Batchable:
    """``limit`` if a batch can be taken from it exactly; else the error that says why not."""
    if isinstance(limit, Window) and limit.sliding:
        raise ValueError(SLIDING_REFUSED)
    if not isinstance(limit, (Window, TokenBucket, Gcra)):
        raise TypeError(KIND_REFUSED.format(kind=type(limit).__name__))
    return limit


class Ledger:
    """One (key, limit) as this process holds it: units taken, their deadlines, the recent rate.

    Not thread-safe by itself: the batchers run one operation at a time.
    """

    def __init__(self, limit: Batchable, options: BatchOptions, name: str) -> None:
        self.limit = batchable(limit)
        self.options = options
        self.target = options.target
        self.min_batch = max(1, options.min_batch)
        max_batch = options.max_batch if options.max_batch is not None else limit_size(limit) // 10
        self.max_batch = max(self.min_batch, max_batch)
        self.tau = options.tau
        self.idle_after = options.target if options.idle_after is None else options.idle_after
        self.refund_margin = options.refund_margin
        self.max_hold = options.target if options.max_hold is None else options.max_hold
        self.recheck = options.target if options.recheck is None else options.recheck
        self.slack = options.slack_ms / 1000
        self.name = name
        self.clock = options.clock
        self.stats = BatchStats()
        self.closed = False
        self._fixed_window = isinstance(limit, Window)
        self._held = 0
        self._spend_until = 0.0
        self._refund_by = 0.0
        self._denied_until = 0.0
        self._denial: Result | None = None
        self._rate = 0.0
        self._last_use = self.clock()
        self._last_remaining = 0

    @property
    def held(self) -> int:
        """Units taken from the server and not yet spent or given back."""
        return self._held

    @property
    def rate(self) -> float:
        """This process's recent rate, units per second."""
        return self._rate

    @property
    def busy(self) -> bool:
        """An operation is under way (the batchers say so from their lock); a hint, for split budgets."""
        return False

    def batch_size(self) -> int:
        """``target`` seconds of the recent rate, within ``[min_batch, max_batch]``."""
        return min(self.max_batch, max(self.min_batch, math.ceil(self._rate * self.target)))

    def _acquire(self, cost: int) -> Steps[Result]:
        """Admit a request of ``cost`` from the batch, taking a new batch when it runs short."""
        if cost < 1:
            raise ValueError("cost must be at least 1")
        if self.closed:
            raise RuntimeError(CLOSED)
        now = self.clock()
        self._note_use(now, cost)
        yield from self._expire(now)
        if self._held >= cost:
            return self._spend(cost, local=True)
        if now < self._denied_until and self._denial is not None:
            self.stats.denied += 1
            self.stats.denied_locally += 1
            return self._local_denial(now)
        return (yield from self._take(now, cost))

    def _note_use(self, now: float, cost: int) -> None:
        elapsed = max(0.0, now - self._last_use)
        self._rate = self._rate * math.exp(-elapsed / self.tau) + cost / self.tau
        self._last_use = now

    def _expire(self, now: float) -> Steps[None]:
        """Units past ``spend_until`` may no longer be spent: give them back if that is still safe."""
        if self._held and now >= self._spend_until:
            yield from self._give_back(now)
            self.stats.dropped += self._held
            self._held = 0

    def _spend(self, cost: int, *, local: bool, reset_after_ms: int = 0) -> Result:
        self._held -= cost
        self.stats.admitted += cost
        return Result(
            True,
            limit_size(self.limit),
            self._last_remaining + self._held,
            0,
            reset_after_ms,
            name=self.name,
            window_seconds=self.limit.window_seconds(),
            local=local,
        )

    def _local_denial(self, now: float) -> Result:
        denial = self._denial
        assert denial is not None
        retry_ms = max(1, math.ceil((self._denied_until + self.slack - now) * 1000))
        return Result(
            False,
            denial.limit,
            0,
            retry_ms,
            max(retry_ms, denial.reset_after_ms),
            name=self.name,
            window_seconds=denial.window_seconds,
            local=True,
        )

    def _take(self, now: float, cost: int) -> Steps[Result]:
        need = cost - self._held
        # In a window's last stretch a refund could land in the next window: take only what is needed.
        last_stretch = self._refund_by <= now < self._spend_until
        ask = need if last_stretch else max(need, self.batch_size())
        sent_at = self.clock()
        reply = yield Take(ask, partial=True)
        assert reply is not None
        self.stats.takes += 1
        if reply.degraded:
            # The failure policy answered: nothing was taken.
            if reply.allowed:
                self.stats.admitted += cost
            else:
                self.stats.denied += 1
            return reply
        granted = reply.granted or 0
        self._last_remaining = reply.remaining
        if granted:
            self._add(granted, sent_at, reply)
            yield from self._expire(self.clock())  # a late reply: its units may be stale already
        if self._held >= cost:
            return self._spend(cost, local=False, reset_after_ms=reply.reset_after_ms)
        if granted == 0:
            self._denied_until = sent_at + min(reply.retry_after_ms / 1000 - self.slack, self.recheck)
            self._denial = reply
            self.stats.denied += 1
            return reply
        # Some units but not ``cost``: one exact call for the rest tells when they will be there.
        rest = cost - self._held
        top_up = yield Take(rest, partial=False)
        assert top_up is not None
        self.stats.takes += 1
        if top_up.allowed and not top_up.degraded:
            self._add(rest, sent_at, top_up)
            # The window may have ended while the top-up was out: the units held from it may not be
            # spent in the next one. Then this request is denied (fewer admitted, never more).
            yield from self._expire(self.clock())
            if self._held >= cost:
                return self._spend(cost, local=False, reset_after_ms=top_up.reset_after_ms)
            self.stats.denied += 1
            return Result(
                False,
                limit_size(self.limit),
                top_up.remaining,
                1,
                top_up.reset_after_ms,
                name=self.name,
                window_seconds=self.limit.window_seconds(),
            )
        self.stats.denied += 1
        return top_up

    def _add(self, units: int, sent_at: float, reply: Result) -> None:
        if self._fixed_window:
            # Spend only in the window they were taken in; give back a margin before it ends.
            spend_until = sent_at + reply.reset_after_ms / 1000 - self.slack
            refund_by = spend_until - self.refund_margin
        else:
            spend_until = sent_at + self.max_hold
            refund_by = math.inf
        if self._held:
            # Older units keep their earlier deadlines: all expire at the earliest (fewer admitted, never more).
            spend_until = min(spend_until, self._spend_until)
            refund_by = min(refund_by, self._refund_by)
        self._held += units
        self.stats.taken += units
        self._spend_until = spend_until
        self._refund_by = refund_by

    def _give_back(self, now: float) -> Steps[None]:
        """Refund every held unit, if it can still reach the server in time."""
        if not self._held or now >= self._refund_by:
            return
        amount = self._held
        # Counted before it is sent: a refund that fails leaves units unused, never spendable twice.
        self._held = 0
        self.stats.refunds += 1
        self.stats.refunded += amount
        yield Refund(amount)

    def _maintain(self) -> Steps[None]:
        """Give units back when idle for ``idle_after``, or before their refund deadline; drop stale ones."""
        now = self.clock()
        yield from self._expire(now)
        idle = now - self._last_use >= self.idle_after
        if self._held and (idle or now + self._tick() >= self._refund_by):
            yield from self._give_back(now)

    def _flush(self) -> Steps[None]:
        """Give back every unused unit now."""
        yield from self._give_back(self.clock())

    def _close(self) -> Steps[None]:
        """Refuse further requests and give back what is left; idempotent."""
        if self.closed:
            return
        self.closed = True
        yield from self._give_back(self.clock())

    def _tick(self) -> float:
        """How often the background thread or task calls ``maintain``."""
        return max(0.005, min(self.idle_after, self.refund_margin) / 2)
