"""The asyncio ``limits`` storages: ``async+valkey-ratelimit://`` and ``async+valkey-ratelimit+cluster://``."""

from __future__ import annotations

from typing import Any

import valkey.asyncio as avalkey
from limits.aio.storage import MovingWindowSupport, SlidingWindowCounterSupport, Storage
from limits.storage.base import TimestampedSlidingWindow
from valkey.asyncio.cluster import ClusterNode, ValkeyCluster

from . import _shared as shared


class AsyncValkeyRatelimitStorage(
    shared.ModuleKeys, Storage, MovingWindowSupport, SlidingWindowCounterSupport, TimestampedSlidingWindow
):
    """The asyncio twin of ``ValkeyRatelimitStorage``, on ``valkey.asyncio.Valkey``."""

    STORAGE_SCHEME = ["async+valkey-ratelimit", "async+valkey-ratelimits"]

    def __init__(
        self,
        uri: str,
        key_prefix: str = shared.PREFIX,
        wrap_exceptions: bool = False,
        **options: Any,
    ) -> None:
        super().__init__(uri, wrap_exceptions=wrap_exceptions, **options)
        self.key_prefix = key_prefix
        # valkey-py types its command methods only partly: calls go through Any.
        self.client: Any = self.connect(uri, **options)

    def connect(self, uri: str, **options: Any) -> Any:
        return avalkey.Valkey.from_url(shared.client_url(uri), **options)

    async def incr(self, key: str, expiry: int, amount: int = 1) -> int:
        key = self.prefixed_key(key)
        pipe = self.client.pipeline(transaction=not isinstance(self.client, ValkeyCluster))
        pipe.incrby(key, amount)
        pipe.execute_command("EXPIRE", key, int(expiry), "NX")
        return int((await pipe.execute())[0])

    async def get(self, key: str) -> int:
        return int(await self.client.get(self.prefixed_key(key)) or 0)

    async def get_expiry(self, key: str) -> float:
        return shared.expiry_at(await self.client.pttl(self.prefixed_key(key)))

    async def check(self) -> bool:
        try:
            return bool(await self.client.ping())
        except Exception:  # noqa: BLE001 -- any failure means unhealthy
            return False

    async def reset(self) -> int | None:
        deleted = 0
        batch: list[Any] = []
        async for key in self.client.scan_iter(match=f"{self.key_prefix}:*", count=1000):
            batch.append(key)
            if len(batch) == 1000:
                deleted += int(await self.client.delete(*batch))
                batch = []
        if batch:
            deleted += int(await self.client.delete(*batch))
        return deleted

    async def clear(self, key: str) -> None:
        await self.client.delete(self.prefixed_key(key))

    async def acquire_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        args = shared.moving_window_args(self.prefixed_key(key), limit, expiry, amount)
        return shared.brief_allowed(await self.client.execute_command(*args))

    async def get_moving_window(self, key: str, limit: int, expiry: int) -> tuple[float, int]:
        return shared.moving_window(await self.client.execute_command("RL.INSPECT", self.prefixed_key(key)))

    async def acquire_sliding_window_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        args = shared.sliding_window_args(self.sliding_key(key), limit, expiry, amount)
        return shared.brief_allowed(await self.client.execute_command(*args))

    async def get_sliding_window(self, key: str, expiry: int) -> tuple[int, float, int, float]:
        return shared.sliding_window(await self.client.execute_command("RL.INSPECT", self.sliding_key(key)))

    async def clear_sliding_window(self, key: str, expiry: int) -> None:
        await self.client.delete(self.sliding_key(key))


class AsyncValkeyRatelimitClusterStorage(AsyncValkeyRatelimitStorage):
    """``async+valkey-ratelimit+cluster://host:port[,host:port...]``: ``valkey.asyncio.ValkeyCluster``."""

    STORAGE_SCHEME = ["async+valkey-ratelimit+cluster", "async+valkey-ratelimits+cluster"]

    def connect(self, uri: str, **options: Any) -> Any:
        nodes: list[Any] = [ClusterNode(host, port) for host, port in shared.cluster_nodes(uri)]
        return ValkeyCluster(startup_nodes=nodes, **{**shared.credentials(uri), **options})
