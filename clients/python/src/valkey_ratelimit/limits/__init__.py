"""``limits`` storages on the valkey-ratelimit module. Importing this registers the URI schemes:

- ``valkey-ratelimit://host:port/db`` (``valkey-ratelimits://`` for TLS)
- ``valkey-ratelimit+cluster://host:port,host:port``
- ``async+valkey-ratelimit://...`` and ``async+valkey-ratelimit+cluster://...``

so that ``Limiter(..., storage_uri="valkey-ratelimit://localhost:6379")`` works
in Flask-Limiter and slowapi.
"""

from .aio import AsyncValkeyRatelimitClusterStorage, AsyncValkeyRatelimitStorage
from .storage import ValkeyRatelimitClusterStorage, ValkeyRatelimitStorage

__all__ = [
    "AsyncValkeyRatelimitClusterStorage",
    "AsyncValkeyRatelimitStorage",
    "ValkeyRatelimitClusterStorage",
    "ValkeyRatelimitStorage",
]
