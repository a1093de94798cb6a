"""The synchronous client: ``RateLimiter`` over ``valkey.Valkey`` or ``ValkeyCluster``."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import valkey
from valkey.cluster import ValkeyCluster

from . import _calls as calls
from .deny_cache import DenyCache
from .errors import LeaseNotGrantedError
from .failure import OnUnavailable, check_policy, on_failure
from .limiters import Algorithm, Duration, Limiter, duration_ms
from .results import AllResult, CellResult, LeaseResult, RefundResult, Result

T = TypeVar("T")

#: How much longer than a BLOCK wait the client waits for the server's answer.
BLOCK_MARGIN_S = 1.0


class RateLimiter:
    """Every command of the module, on a ``valkey.Valkey`` or ``valkey.cluster.ValkeyCluster``.

    ``on_unavailable`` is the failure policy (see ``valkey_ratelimit.failure``).
    A synchronous client's time budget is its own ``socket_timeout`` and
    ``socket_connect_timeout``: build it with short ones (see ``connect``).
    ``deny_cache`` (off by default) answers ``hit`` locally while the server's
    last denial of the same request lasts (see ``valkey_ratelimit.deny_cache``).
    """

    def __init__(
        self,
        client: valkey.Valkey | ValkeyCluster,
        *,
        on_unavailable: OnUnavailable = "raise",
        deny_cache: DenyCache | None = None,
    ) -> None:
        self.client = client
        # valkey-py types its command methods only partly: calls go through Any.
        self._client: Any = client
        self.on_unavailable = check_policy(on_unavailable)
        self.deny_cache = deny_cache

    def _run(self, call: calls.Call[T]) -> T:
        if call.block_ms is not None:
            self._check_block(call.block_ms)
        kwargs: dict[str, Any] = {}
        if call.nodes is not None and isinstance(self.client, ValkeyCluster):
            kwargs["target_nodes"] = call.nodes
        try:
            reply = self._client.execute_command(*call.args, **kwargs)
        except Exception as exc:  # noqa: BLE001 -- on_failure re-raises all but unavailability
            return on_failure(call, exc, self.on_unavailable)
        return call.parse(reply)

    def _check_block(self, block_ms: int) -> None:
        """A BLOCK call must be able to outwait the server: the socket timeout must exceed BLOCK."""
        if isinstance(self.client, ValkeyCluster):
            timeout = self.client.nodes_manager.connection_kwargs.get("socket_timeout")
        else:
            timeout = self.client.connection_pool.connection_kwargs.get("socket_timeout")
        if timeout is not None and (block_ms == 0 or timeout < block_ms / 1000 + BLOCK_MARGIN_S):
            raise ValueError(
                f"BLOCK of {block_ms} ms needs a client whose socket_timeout ({timeout} s) exceeds it by "
                f"{BLOCK_MARGIN_S} s: use a client of its own for waiting calls"
            )

    def hit(
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
        """One request against ``limiter`` on ``key``: ``RL.TOKENBUCKET``, ``RL.WINDOW``,
        ``RL.SLIDINGLOG``, ``RL.GCRA``, or ``RL.LIMIT`` for a ``Policy``."""
        options: dict[str, Any] = {"cost": cost, "dry_run": dry_run, "partial": partial, "lockout": lockout}
        call = calls.hit(key, limiter, block=block, name=name, **options)
        cache = self.deny_cache
        query = None if cache is None else cache.query(key, limiter, block=block, name=name, **options)
        if cache is None or query is None:
            return self._run(call)
        if (local := cache.check(query)) is not None:
            return local
        sent_at = cache.clock()
        result = self._run(call)
        cache.record(query, sent_at, result)
        return result

    def all(
        self,
        items: Sequence[tuple[str, Limiter]],
        *,
        cost: int = 1,
        dry_run: bool = False,
        partial: bool = False,
        lockout: Duration | None = None,
        names: Sequence[str] | None = None,
    ) -> AllResult:
        """``RL.ALL``: consumes from every limiter or from none. In a cluster the keys must share a
        slot: build them with ``keys.same_slot``."""
        return self._run(calls.all_of(items, cost=cost, dry_run=dry_run, partial=partial, lockout=lockout, names=names))

    def throttle(self, key: str, max_burst: int, count_per_period: int, period: Duration, quantity: int = 1) -> Result:
        return self._run(calls.throttle(key, max_burst, count_per_period, period, quantity))

    def cl_throttle(
        self, key: str, max_burst: int, count_per_period: int, period: int, quantity: int = 1
    ) -> CellResult:
        return self._run(calls.cl_throttle(key, max_burst, count_per_period, period, quantity))

    def peek(self, key: str) -> Result | None:
        return self._run(calls.peek(key))

    def inspect(self, key: str) -> dict[str, Any] | None:
        return self._run(calls.inspect(key))

    def refund(self, key: str, amount: int) -> RefundResult | None:
        if self.deny_cache is not None:
            self.deny_cache.forget(key)
        return self._run(calls.refund(key, amount))

    def unlock(self, key: str) -> bool:
        if self.deny_cache is not None:
            self.deny_cache.forget(key)
        return self._run(calls.unlock(key))

    def lease(
        self,
        key: str,
        limit: int,
        ttl: Duration,
        *,
        cost: int = 1,
        dry_run: bool = False,
        block: Duration | None = None,
    ) -> LeaseResult:
        return self._run(calls.lease(key, limit, ttl, cost=cost, dry_run=dry_run, block=block))

    def release(self, key: str, lease_id: str) -> bool:
        return self._run(calls.release(key, lease_id))

    def extend(self, key: str, lease_id: str, ttl: Duration) -> bool:
        return self._run(calls.extend(key, lease_id, ttl))

    @contextmanager
    def hold(
        self, key: str, limit: int, ttl: Duration, *, cost: int = 1, block: Duration | None = None
    ) -> Iterator[LeaseResult]:
        """A lease for the ``with`` block: extended every ``ttl / 3`` while held, released at the end.

        Raises ``LeaseNotGrantedError`` when no lease is granted. A degraded
        (fail-open) lease has no id: nothing to extend or release.
        """
        granted = self.lease(key, limit, ttl, cost=cost, block=block)
        if not granted.allowed:
            raise LeaseNotGrantedError(f"no lease on {key!r}: retry after {granted.retry_after_ms} ms")
        lease_id = granted.lease_id
        if lease_id is None:
            yield granted
            return
        stop = threading.Event()

        def heartbeat() -> None:
            while not stop.wait(duration_ms(ttl) / 3000):
                if not self.extend(key, lease_id, ttl):
                    return

        beat = threading.Thread(target=heartbeat, name=f"lease {key}", daemon=True)
        beat.start()
        try:
            yield granted
        finally:
            stop.set()
            beat.join()
            self.release(key, lease_id)

    def policy_set(self, name: str, limiter: Algorithm) -> None:
        """``RL.POLICY.SET``, on every primary in a cluster."""
        self._run(calls.policy_set(name, limiter))

    def policy_get(self, name: str) -> Algorithm | None:
        return self._run(calls.policy_get(name))

    def policy_del(self, *names: str) -> int:
        return self._run(calls.policy_del(*names))

    def policy_list(self) -> list[str]:
        return self._run(calls.policy_list())


def connect(url: str, *, timeout: float = 0.05, cluster: bool = False) -> valkey.Valkey | ValkeyCluster:
    """A client that gives up quickly, as a limiter should: ``timeout`` seconds to connect and per
    command, no retries. A down server then costs a request at most about ``2 * timeout``."""
    options: dict[str, Any] = {"socket_connect_timeout": timeout, "socket_timeout": timeout}
    factory: Any = ValkeyCluster if cluster else valkey.Valkey
    client: valkey.Valkey | ValkeyCluster = factory.from_url(url, **options)
    return client
