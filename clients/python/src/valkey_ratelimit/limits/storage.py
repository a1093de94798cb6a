"""The synchronous ``limits`` storages: ``valkey-ratelimit://`` and ``valkey-ratelimit+cluster://``."""

from __future__ import annotations

from typing import Any

import valkey
from limits.storage import MovingWindowSupport, SlidingWindowCounterSupport, Storage
from limits.storage.base import TimestampedSlidingWindow
from valkey.cluster import ClusterNode, ValkeyCluster

from . import _shared as shared

# valkey-py's ClusterNode has no annotations.
_node: Any = ClusterNode


class ValkeyRatelimitStorage(
    shared.ModuleKeys, Storage, MovingWindowSupport, SlidingWindowCounterSupport, TimestampedSlidingWindow
):
    """``limits`` on the valkey-ratelimit module: ``valkey-ratelimit://[user:password@]host:port[/db]``
    (``valkey-ratelimits://`` for TLS). Remaining ``options`` go to ``valkey.Valkey``.

    ``TimestampedSlidingWindow``: the module's sliding windows are aligned to
    the Unix epoch, as those of ``limits``' timestamp-keyed storages.
    """

    STORAGE_SCHEME = ["valkey-ratelimit", "valkey-ratelimits"]

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
        return valkey.Valkey.from_url(shared.client_url(uri), **options)

    def incr(self, key: str, expiry: int, amount: int = 1) -> int:
        key = self.prefixed_key(key)
        pipe = self.client.pipeline(transaction=not isinstance(self.client, ValkeyCluster))
        pipe.incrby(key, amount)
        pipe.execute_command("EXPIRE", key, int(expiry), "NX")
        return int(pipe.execute()[0])

    def get(self, key: str) -> int:
        return int(self.client.get(self.prefixed_key(key)) or 0)

    def get_expiry(self, key: str) -> float:
        return shared.expiry_at(self.client.pttl(self.prefixed_key(key)))

    def check(self) -> bool:
        try:
            return bool(self.client.ping())
        except Exception:  # noqa: BLE001 -- any failure means unhealthy
            return False

    def reset(self) -> int | None:
        """Deletes every key under the prefix (SCAN and DEL in batches, on every node)."""
        deleted = 0
        batch: list[Any] = []
        for key in self.client.scan_iter(match=f"{self.key_prefix}:*", count=1000):
            batch.append(key)
            if len(batch) == 1000:
                deleted += int(self.client.delete(*batch))
                batch = []
        if batch:
            deleted += int(self.client.delete(*batch))
        return deleted

    def clear(self, key: str) -> None:
        self.client.delete(self.prefixed_key(key))

    def acquire_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        args = shared.moving_window_args(self.prefixed_key(key), limit, expiry, amount)
        return shared.brief_allowed(self.client.execute_command(*args))

    def get_moving_window(self, key: str, limit: int, expiry: int) -> tuple[float, int]:
        return shared.moving_window(self.client.execute_command("RL.INSPECT", self.prefixed_key(key)))

    def acquire_sliding_window_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        args = shared.sliding_window_args(self.sliding_key(key), limit, expiry, amount)
        return shared.brief_allowed(self.client.execute_command(*args))

    def get_sliding_window(self, key: str, expiry: int) -> tuple[int, float, int, float]:
        return shared.sliding_window(self.client.execute_command("RL.INSPECT", self.sliding_key(key)))

    def clear_sliding_window(self, key: str, expiry: int) -> None:
        self.client.delete(self.sliding_key(key))


class ValkeyRatelimitClusterStorage(ValkeyRatelimitStorage):
    """``valkey-ratelimit+cluster://[user:password@]host:port[,host:port...]``: ``ValkeyCluster``."""

    STORAGE_SCHEME = ["valkey-ratelimit+cluster", "valkey-ratelimits+cluster"]

    def connect(self, uri: str, **options: Any) -> Any:
        nodes: list[Any] = [_node(host, port) for host, port in shared.cluster_nodes(uri)]
        return ValkeyCluster(startup_nodes=nodes, **{**shared.credentials(uri), **options})
