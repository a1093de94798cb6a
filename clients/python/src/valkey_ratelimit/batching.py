"""Token batching: take a batch of units from the server at once, spend it here, give back the rest.

A hot limit shared by many processes costs one round trip per request to the
one primary that holds its key. CockroachDB's distributed token bucket and
Doorman answer this by letting each process hold a share: here a process asks
for ``n`` units with ``COST n PARTIAL`` (it takes what is there), admits
requests from them without a round trip, and gives back what it did not use
with ``RL.REFUND`` when it goes idle, on ``close()``, or before the units
would go stale.

``n`` follows the process's own recent rate: about ``target`` seconds of its
traffic (an exponentially weighted rate, time constant ``tau``), between
``min_batch`` and ``max_batch``.

What it guarantees (docs/scale.md has the measurements):

- **Fixed windows** (``Window``, not sliding) stay exact: units are spent only
  in the window they were taken in (until the reply's ``reset_after_ms``,
  counted from when the request was sent, less ``slack_ms``), so no window
  admits more than its limit. A refund lands in the window it was meant for
  only if it reaches the server before that window ends: refunds are sent no
  later than ``refund_margin`` seconds before the end, and in that last
  stretch the process takes only what a request needs. A refund delayed past
  the margin would give the units to the next window: that margin is the one
  assumption.
- **Token buckets and GCRA**: units are spent within ``max_hold`` seconds of
  being taken, so over any span ``T`` at most ``capacity + rate * (T +
  max_hold)`` are admitted instead of ``capacity + rate * T``. Refunds are
  always safe (capped at the capacity by the server).
- Sliding windows, sliding logs and policies are refused: a unit spent later
  than it was logged lets any sliding span admit up to a batch more.
- It admits less than the limit while units sit unused in other processes:
  at most the sum of their batches (``max_batch`` each), until they spend or
  give them back.

When the server denies (nothing left), the batcher denies locally for the
server's ``retry_after_ms``, but at most ``recheck`` seconds, so units given
back by other processes are found again.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

from .client import RateLimiter
from .limiters import Gcra, TokenBucket, Window, limit_size
from .results import Result

#: The limiters a batch can be taken from.
Batchable = Window | TokenBucket | Gcra


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


class TokenBatcher:
    """One (key, limit) spent in batches by this process; thread-safe.

    Use as a context manager, or call ``close()``: the unused units go back
    to the server. A background thread (``background=True``) gives units
    back when the process goes idle for ``idle_after`` seconds and before
    they go stale; without it, call ``maintain()`` yourself.
    """

    def __init__(
        self,
        limiter: RateLimiter,
        key: str,
        limit: Batchable,
        *,
        target: float = 0.3,
        min_batch: int = 1,
        max_batch: int | None = None,
        tau: float = 1.0,
        idle_after: float | None = None,
        refund_margin: float = 0.1,
        max_hold: float | None = None,
        recheck: float | None = None,
        slack_ms: int = 2,
        name: str = "default",
        background: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(limit, Window) and limit.sliding:
            raise ValueError("a sliding window cannot be batched exactly: use a fixed Window, TokenBucket or Gcra")
        if not isinstance(limit, (Window, TokenBucket, Gcra)):
            raise TypeError(f"cannot batch {type(limit).__name__}: use a fixed Window, TokenBucket or Gcra")
        self.limiter = limiter
        self.key = key
        self.limit = limit
        self.target = target
        self.min_batch = max(1, min_batch)
        self.max_batch = max(self.min_batch, max_batch if max_batch is not None else limit_size(limit) // 10)
        self.tau = tau
        self.idle_after = target if idle_after is None else idle_after
        self.refund_margin = refund_margin
        self.max_hold = target if max_hold is None else max_hold
        self.recheck = target if recheck is None else recheck
        self.slack = slack_ms / 1000
        self.name = name
        self.clock = clock
        self.stats = BatchStats()
        self._fixed_window = isinstance(limit, Window)
        self._lock = threading.Lock()
        self._held = 0
        self._spend_until = 0.0
        self._refund_by = 0.0
        self._denied_until = 0.0
        self._denial: Result | None = None
        self._rate = 0.0
        self._last_use = clock()
        self._last_remaining = 0
        self._closed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._run_maintenance, name=f"batch {key}", daemon=True)
            self._thread.start()

    @property
    def held(self) -> int:
        """Units taken from the server and not yet spent or given back."""
        return self._held

    @property
    def rate(self) -> float:
        """This process's recent rate, units per second."""
        return self._rate

    def batch_size(self) -> int:
        """``target`` seconds of the recent rate, within ``[min_batch, max_batch]``."""
        return min(self.max_batch, max(self.min_batch, math.ceil(self._rate * self.target)))

    def acquire(self, cost: int = 1) -> Result:
        """Admit a request of ``cost`` from the batch, taking a new batch when it runs short."""
        if cost < 1:
            raise ValueError("cost must be at least 1")
        with self._lock:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            now = self.clock()
            self._note_use(now, cost)
            self._expire(now)
            if self._held >= cost:
                return self._spend(cost, local=True)
            if now < self._denied_until and self._denial is not None:
                self.stats.denied += 1
                self.stats.denied_locally += 1
                return self._local_denial(now)
            return self._take(now, cost)

    def _note_use(self, now: float, cost: int) -> None:
        elapsed = max(0.0, now - self._last_use)
        self._rate = self._rate * math.exp(-elapsed / self.tau) + cost / self.tau
        self._last_use = now

    def _expire(self, now: float) -> None:
        """Units past ``spend_until`` may no longer be spent: give them back if that is still safe."""
        if self._held and now >= self._spend_until:
            self._give_back(now)
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

    def _take(self, now: float, cost: int) -> Result:
        need = cost - self._held
        # In a window's last stretch a refund could land in the next window: take only what is needed.
        last_stretch = self._refund_by <= now < self._spend_until
        ask = need if last_stretch else max(need, self.batch_size())
        sent_at = self.clock()
        reply = self.limiter.hit(self.key, self.limit, cost=ask, partial=True, name=self.name)
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
            self._expire(self.clock())  # a late reply: its units may be stale already
        if self._held >= cost:
            return self._spend(cost, local=False, reset_after_ms=reply.reset_after_ms)
        if granted == 0:
            self._denied_until = sent_at + min(reply.retry_after_ms / 1000 - self.slack, self.recheck)
            self._denial = reply
            self.stats.denied += 1
            return reply
        # Some units but not ``cost``: one exact call for the rest tells when they will be there.
        rest = cost - self._held
        top_up = self.limiter.hit(self.key, self.limit, cost=rest, name=self.name)
        self.stats.takes += 1
        if top_up.allowed and not top_up.degraded:
            self._add(rest, sent_at, top_up)
            return self._spend(cost, local=False, reset_after_ms=top_up.reset_after_ms)
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

    def _give_back(self, now: float) -> None:
        """Refund every held unit, if it can still reach the server in time (the caller holds the lock)."""
        if not self._held or now >= self._refund_by:
            return
        amount = self._held
        self._held = 0
        self.stats.refunds += 1
        self.stats.refunded += amount
        self.limiter.refund(self.key, amount)

    def maintain(self) -> None:
        """Give units back when idle for ``idle_after``, or before their refund deadline; drop stale ones."""
        with self._lock:
            now = self.clock()
            self._expire(now)
            tick = self._tick()
            idle = now - self._last_use >= self.idle_after
            if self._held and (idle or now + tick >= self._refund_by):
                self._give_back(now)

    def flush(self) -> None:
        """Give back every unused unit now."""
        with self._lock:
            self._give_back(self.clock())

    def _tick(self) -> float:
        return max(0.005, min(self.idle_after, self.refund_margin) / 2)

    def _run_maintenance(self) -> None:
        while not self._stop.wait(self._tick()):
            try:
                self.maintain()
            except Exception:  # noqa: BLE001 -- a failed refund only leaves units unused; keep going
                continue

    def close(self) -> None:
        """Stop the background thread and give back what is left; idempotent."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._give_back(self.clock())

    def __enter__(self) -> TokenBatcher:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
