"""Split budgets for asyncio: ``AsyncSplitLimit``, the twin of ``SplitLimit``.

The keys, the shares and the two choices are ``split._Shards``'s, so what
``valkey_ratelimit.split`` says holds here too, with ``batching`` through
``AsyncTokenBatcher``.
"""

from __future__ import annotations

import random
from types import TracebackType

from ._ledger import BatchOptions
from ._steps import arun
from .asyncio import AsyncRateLimiter
from .asyncio_batching import AsyncTokenBatcher
from .limiters import Algorithm
from .results import Result
from .split import _Shards


class AsyncSplitLimit(_Shards):
    """``limit`` on ``key``, split over ``shards`` keys on different slots: ``await hit()``.

    With ``batching``, each share is spent through an ``AsyncTokenBatcher``:
    use ``async with`` or await ``aclose()``, so that unused units go back.
    """

    def __init__(
        self,
        limiter: AsyncRateLimiter,
        key: str,
        limit: Algorithm,
        shards: int,
        *,
        rng: random.Random | None = None,
        batching: BatchOptions | None = None,
    ) -> None:
        super().__init__(key, limit, shards, rng)
        self.limiter = limiter
        self.batchers: list[AsyncTokenBatcher] = []
        if batching is not None:
            self.batchers = [AsyncTokenBatcher(limiter, k, lim, **batching.keywords()) for k, lim in self._batchable()]

    async def hit(self, cost: int = 1, *, name: str = "default") -> Result:
        """See ``SplitLimit.hit``."""

        async def ask(shard: int) -> Result:
            if self.batchers:
                result = await self.batchers[shard].acquire(cost)
            else:
                result = await self.limiter.hit(self.keys[shard], self.limits[shard], cost=cost, name=name)
            return self._as_whole(result, name)

        return await arun(self._plan(cost, self.batchers), ask)

    async def maintain(self) -> None:
        for batcher in self.batchers:
            await batcher.maintain()

    async def flush(self) -> None:
        for batcher in self.batchers:
            await batcher.flush()

    async def aclose(self) -> None:
        """Close every share's batcher, giving back what is left; idempotent."""
        for batcher in self.batchers:
            await batcher.aclose()

    async def __aenter__(self) -> AsyncSplitLimit:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
