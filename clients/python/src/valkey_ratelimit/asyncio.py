"""The asyncio client: ``AsyncRateLimiter`` over ``valkey.asyncio.Valkey`` or its ``ValkeyCluster``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any, TypeVar

import valkey.asyncio as avalkey
from valkey.asyncio.cluster import ValkeyCluster

from . import _calls as calls
from .client import BLOCK_MARGIN_S
from .deny_cache import DenyCache
from .errors import LeaseNotGrantedError
from .failure import OnUnavailable, check_policy, on_failure
from .limiters import Algorithm, Duration, Limiter, duration_ms
from .results import AllResult, CellResult, LeaseResult, RefundResult, Result

T = TypeVar("T")


class AsyncRateLimiter:
    """Every command of the module, awaited.

    ``timeout`` (seconds) bounds each whole call, connecting included; a call
    that takes longer counts as unavailable for the failure policy
    ``on_unavailable``. A BLOCK call gets its wait plus a second instead.
    ``deny_cache``: see ``RateLimiter``.
    """

    def __init__(
        self,
        client: avalkey.Valkey | ValkeyCluster,
        *,
        on_unavailable: OnUnavailable = "raise",
        timeout: float | None = None,
        deny_cache: DenyCache | None = None,
    ) -> None:
        self.client = client
        # valkey-py types its command methods only partly: calls go through Any.
        self._client: Any = client
        self.on_unavailable = check_policy(on_unavailable)
        self.timeout = timeout
        self.deny_cache = deny_cache

    async def _run(self, call: calls.Call[T]) -> T:
        kwargs: dict[str, Any] = {}
        if call.nodes is not None and isinstance(self.client, ValkeyCluster):
            kwargs["target_nodes"] = call.nodes
        timeout = self.timeout
        if call.block_ms is not None:
            timeout = None if call.block_ms == 0 else call.block_ms / 1000 + BLOCK_MARGIN_S
        try:
            reply = await asyncio.wait_for(self._client.execute_command(*call.args, **kwargs), timeout)
        except Exception as exc:  # noqa: BLE001 -- on_failure re-raises all but unavailability
            return on_failure(call, exc, self.on_unavailable)
        return call.parse(reply)

    async def hit(
        self,
        key: str,
        limiter: Limiter,
        *,
        cost: int = 1,
        dry_run: bool = False,
        partial: bool = False,
        lockout: Duration | None = None,
        block: Duration | None = None,
        name: str = "default",
    ) -> Result:
        """See ``RateLimiter.hit``."""
        options: dict[str, Any] = {"cost": cost, "dry_run": dry_run, "partial": partial, "lockout": lockout}
        call = calls.hit(key, limiter, block=block, name=name, **options)
        cache = self.deny_cache
        query = None if cache is None else cache.query(key, limiter, block=block, name=name, **options)
        if cache is None or query is None:
            return await self._run(call)
        if (local := cache.check(query)) is not None:
            return local
        sent_at = cache.clock()
        result = await self._run(call)
        cache.record(query, sent_at, result)
        return result

    async def all(
        self,
        items: Sequence[tuple[str, Limiter]],
        *,
        cost: int = 1,
        dry_run: bool = False,
        partial: bool = False,
        lockout: Duration | None = None,
        names: Sequence[str] | None = None,
    ) -> AllResult:
        """See ``RateLimiter.all``."""
        return await self._run(
            calls.all_of(items, cost=cost, dry_run=dry_run, partial=partial, lockout=lockout, names=names)
        )

    async def throttle(
        self, key: str, max_burst: int, count_per_period: int, period: Duration, quantity: int = 1
    ) -> Result:
        return await self._run(calls.throttle(key, max_burst, count_per_period, period, quantity))

    async def cl_throttle(
        self, key: str, max_burst: int, count_per_period: int, period: int, quantity: int = 1
    ) -> CellResult:
        return await self._run(calls.cl_throttle(key, max_burst, count_per_period, period, quantity))

    async def peek(self, key: str) -> Result | None:
        return await self._run(calls.peek(key))

    async def inspect(self, key: str) -> dict[str, Any] | None:
        return await self._run(calls.inspect(key))

    async def refund(self, key: str, amount: int) -> RefundResult | None:
        if self.deny_cache is not None:
            self.deny_cache.forget(key)
        return await self._run(calls.refund(key, amount))

    async def unlock(self, key: str) -> bool:
        if self.deny_cache is not None:
            self.deny_cache.forget(key)
        return await self._run(calls.unlock(key))

    async def lease(
        self,
        key: str,
        limit: int,
        ttl: Duration,
        *,
        cost: int = 1,
        dry_run: bool = False,
        block: Duration | None = None,
    ) -> LeaseResult:
        return await self._run(calls.lease(key, limit, ttl, cost=cost, dry_run=dry_run, block=block))

    async def release(self, key: str, lease_id: str) -> bool:
        return await self._run(calls.release(key, lease_id))

    async def extend(self, key: str, lease_id: str, ttl: Duration) -> bool:
        return await self._run(calls.extend(key, lease_id, ttl))

    @contextlib.asynccontextmanager
    async def hold(
        self, key: str, limit: int, ttl: Duration, *, cost: int = 1, block: Duration | None = None
    ) -> AsyncIterator[LeaseResult]:
        """See ``RateLimiter.hold``: the heartbeat is a task."""
        granted = await self.lease(key, limit, ttl, cost=cost, block=block)
        if not granted.allowed:
            raise LeaseNotGrantedError(f"no lease on {key!r}: retry after {granted.retry_after_ms} ms")
        lease_id = granted.lease_id
        if lease_id is None:
            yield granted
            return

        async def heartbeat() -> None:
            while True:
                await asyncio.sleep(duration_ms(ttl) / 3000)
                if not await self.extend(key, lease_id, ttl):
                    return

        beat = asyncio.create_task(heartbeat())
        try:
            yield granted
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
            await self.release(key, lease_id)

    async def policy_set(self, name: str, limiter: Algorithm) -> None:
        await self._run(calls.policy_set(name, limiter))

    async def policy_get(self, name: str) -> Algorithm | None:
        return await self._run(calls.policy_get(name))

    async def policy_del(self, *names: str) -> int:
        return await self._run(calls.policy_del(*names))

    async def policy_list(self) -> list[str]:
        return await self._run(calls.policy_list())
