"""Token batching for asyncio: ``AsyncTokenBatcher``, the twin of ``TokenBatcher``.

The same ledger (``_ledger``) makes every decision, so the guarantees are
those of ``valkey_ratelimit.batching``: fixed windows exact given
``refund_margin``, token buckets and GCRA at most ``rate * max_hold`` more
per span, sliding limiters and policies refused.

Concurrent coroutines share one batcher: one of them sends at a time (an
``asyncio.Lock`` held across the send), the others wait and then spend from
what it took, so a burst costs one fetch and no unit is spent twice. The
idle and deadline refunds run in a task, started by the first ``acquire``
(a batcher may be built before the event loop runs).

A cancelled ``acquire`` (a caller's timeout) that was taking a batch loses
what the server granted: those units are neither spent nor given back, so
fewer are admitted, never more.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from types import TracebackType
from typing import TypeVar

from ._ledger import Batchable, BatchOptions, Ledger, Refund, Steps, Take
from ._steps import arun
from .asyncio import AsyncRateLimiter
from .results import Result

T = TypeVar("T")


class AsyncTokenBatcher(Ledger):
    """One (key, limit) spent in batches by this process's coroutines.

    Use ``async with``, or await ``aclose()``: the unused units go back to
    the server. With ``background=True`` a task gives units back when the
    process goes idle for ``idle_after`` seconds and before they go stale;
    without it, await ``maintain()`` yourself. The keywords are
    ``BatchOptions``.
    """

    def __init__(
        self,
        limiter: AsyncRateLimiter,
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
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    @property
    def busy(self) -> bool:
        # A coroutine holds the lock only across an await: a call to the server is under way.
        return self._lock.locked()

    async def _run(self, steps: Steps[T]) -> T:
        return await arun(steps, self._send)

    async def _send(self, request: Take | Refund) -> Result | None:
        if isinstance(request, Take):
            key, limit, name = self.key, self.limit, self.name
            return await self.limiter.hit(key, limit, cost=request.cost, partial=request.partial, name=name)
        await self.limiter.refund(self.key, request.amount)
        return None

    async def acquire(self, cost: int = 1) -> Result:
        """Admit a request of ``cost`` from the batch, taking a new batch when it runs short."""
        self._start_maintenance()
        async with self._lock:
            return await self._run(self._acquire(cost))

    async def maintain(self) -> None:
        """Give units back when idle for ``idle_after``, or before their refund deadline; drop stale ones."""
        async with self._lock:
            await self._run(self._maintain())

    async def flush(self) -> None:
        """Give back every unused unit now."""
        async with self._lock:
            await self._run(self._flush())

    def _start_maintenance(self) -> None:
        if self.options.background and self._task is None and not self.closed:
            self._task = asyncio.get_running_loop().create_task(self._maintenance(), name=f"batch {self.key}")

    async def _maintenance(self) -> None:
        while True:
            await asyncio.sleep(self._tick())
            try:
                await self.maintain()
            except Exception:  # noqa: BLE001 -- a failed refund only leaves units unused; keep going
                continue

    async def aclose(self) -> None:
        """Stop the background task and give back what is left; idempotent."""
        async with self._lock:
            # Cancelled while this holds the lock, the task is asleep or waiting for the lock: never
            # halfway through a refund, which would then be lost.
            task, self._task = self._task, None
            if task is not None:
                task.cancel()
            await self._run(self._close())
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def __aenter__(self) -> AsyncTokenBatcher:
        self._start_maintenance()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
