"""valkey-ratelimit: the module's rate-limit commands from Python, sync and asyncio.

    import valkey
    from valkey_ratelimit import RateLimiter, TokenBucket

    limiter = RateLimiter(valkey.Valkey())
    result = limiter.hit("rl:api:key:7f3a", TokenBucket(10, 5, "1s"))
    if not result.allowed:
        return 429, result.headers()

The ``limits`` storage (Flask-Limiter, slowapi): ``import valkey_ratelimit.limits``,
then ``storage_uri="valkey-ratelimit://host:6379"``.
"""

from .asyncio import AsyncRateLimiter
from .asyncio_batching import AsyncTokenBatcher
from .asyncio_split import AsyncSplitLimit
from .batching import BatchOptions, BatchStats, TokenBatcher
from .client import RateLimiter, connect
from .deny_cache import DenyCache
from .errors import (
    CommandError,
    LeaseNotGrantedError,
    PolicyNotFoundError,
    RateLimitError,
    TryAgainError,
    UnavailableError,
    WrongTypeError,
)
from .keys import same_slot
from .limiters import Gcra, Policy, SlidingLog, TokenBucket, Window
from .results import AllResult, CellResult, LeaseResult, RefundResult, Result
from .split import SplitLimit, shard_keys, split_limit

__version__ = "0.1.0"

__all__ = [
    "AllResult",
    "AsyncRateLimiter",
    "AsyncSplitLimit",
    "AsyncTokenBatcher",
    "BatchOptions",
    "BatchStats",
    "CellResult",
    "CommandError",
    "DenyCache",
    "Gcra",
    "LeaseNotGrantedError",
    "LeaseResult",
    "Policy",
    "PolicyNotFoundError",
    "RateLimitError",
    "RateLimiter",
    "RefundResult",
    "Result",
    "SlidingLog",
    "SplitLimit",
    "TokenBatcher",
    "TokenBucket",
    "TryAgainError",
    "UnavailableError",
    "Window",
    "WrongTypeError",
    "connect",
    "same_slot",
    "shard_keys",
    "split_limit",
]
