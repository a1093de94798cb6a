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

The rules live in ``_ledger`` (no I/O), shared with the asyncio twin
``AsyncTokenBatcher`` (``valkey_ratelimit.asyncio_batching``); this module
only sends what the ledger asks for.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TypeVar

from ._ledger import Batchable, BatchOptions, BatchStats, Ledger, Refund, Steps, Take
from ._steps import run
from .client import RateLimiter
from .results import Result

__all__ = ["BatchOptions", "BatchStats", "Batchable", "TokenBatcher"]

T = TypeVar("T")


class TokenBatcher(Ledger):
    """One (key, limit) spent in batches by this process; thread-safe.

    Use as a context manager, or call ``close()``: the unused units go back
    to the server. A background thread (``background=True``) gives units
    back when the process goes idle for ``idle_after`` seconds and before
    they go stale; without it, call ``maintain()`` yourself. The keywords
    are ``BatchOptions``.
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
        options = BatchOptions(
            target=target,
            min_batch=min_batch,
            max_batch=max_batch,
            tau=tau,
            idle_after=idle_after,
            refund_margin=refund_margin,
            max_hold=max_hold,
            recheck=recheck,
            slack_ms=slack_ms,
            background=background,
            clock=clock,
        )
        super().__init__(limit, options, name)
        self.limiter = limiter
        self.key = key
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._run_maintenance, name=f"batch {key}", daemon=True)
            self._thread.start()

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    def _run(self, steps: Steps[T]) -> T:
        return run(steps, self._send)

    def _send(self, request: Take | Refund) -> Result | None:
        if isinstance(request, Take):
            return self.limiter.hit(self.key, self.limit, cost=request.cost, partial=request.partial, name=self.name)
        self.limiter.refund(self.key, request.amount)
        return None

    def acquire(self, cost: int = 1) -> Result:
        """Admit a request of ``cost`` from the batch, taking a new batch when it runs short."""
        with self._lock:
            return self._run(self._acquire(cost))

    def maintain(self) -> None:
        """Give units back when idle for ``idle_after``, or before their refund deadline; drop stale ones."""
        with self._lock:
            self._run(self._maintain())

    def flush(self) -> None:
        """Give back every unused unit now."""
        with self._lock:
            self._run(self._flush())

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
            self._run(self._close())

    def __enter__(self) -> TokenBatcher:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
