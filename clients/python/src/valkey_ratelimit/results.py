"""Decisions as small immutable objects, and the HTTP headers they map to.

Header syntax: ``RateLimit-Policy`` and ``RateLimit`` as in the IETF draft
(draft-ietf-httpapi-ratelimit-headers, -07 and later), the de-facto
``X-RateLimit-*``, and ``Retry-After`` on a denial, in whole seconds rounded
up (a client that waits that long is never early).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any


def ceil_seconds(ms: int) -> int:
    """Milliseconds as whole seconds, rounded up."""
    return -(-ms // 1000)


@dataclass(frozen=True)
class Result:
    """One limiter's decision: the module's five fields, plus what the call adds.

    ``retry_after_ms`` is -1 when the request can never be allowed (its cost
    exceeds the limit). ``granted`` is set with ``partial=True``.
    ``degraded`` marks a result made up by the failure policy because the
    server could not be reached: then only ``allowed`` means anything.
    ``local`` marks a decision made in this process without asking the server:
    a denial from the deny cache, or units spent from a batch
    (``valkey_ratelimit.deny_cache``, ``valkey_ratelimit.batching``).
    """

    allowed: bool
    limit: int
    remaining: int
    retry_after_ms: int
    reset_after_ms: int
    granted: int | None = None
    name: str = "default"
    window_seconds: int | None = field(default=None, compare=False)
    degraded: bool = False
    local: bool = False

    @property
    def retry_after(self) -> timedelta | None:
        """When the same request would be allowed; None when never."""
        return None if self.retry_after_ms < 0 else timedelta(milliseconds=self.retry_after_ms)

    @property
    def reset_after(self) -> timedelta:
        """When the limiter is completely full again."""
        return timedelta(milliseconds=self.reset_after_ms)

    @property
    def retry_after_seconds(self) -> int | None:
        """``Retry-After``'s value: whole seconds, rounded up, at least 1; None when never."""
        if self.retry_after_ms < 0:
            return None
        return max(1, ceil_seconds(self.retry_after_ms))

    def __bool__(self) -> bool:
        return self.allowed

    def headers(self) -> dict[str, str]:
        """The rate-limit response headers, for a 200 and a 429 alike."""
        return _headers(self.allowed, self.retry_after_seconds, [self], self)


@dataclass(frozen=True)
class LeaseResult(Result):
    """``RL.LEASE``: the five fields, and the lease granted (None when none was)."""

    lease_id: str | None = None
    lease_ttl_ms: int = 0


@dataclass(frozen=True)
class RefundResult(Result):
    """``RL.REFUND``: the state afterwards, and how much actually came back."""

    refunded: int = 0


@dataclass(frozen=True)
class AllResult:
    """``RL.ALL``: all or nothing over several limiters, one ``Result`` each."""

    allowed: bool
    retry_after_ms: int
    limiters: tuple[Result, ...]
    granted: int | None = None

    @property
    def retry_after(self) -> timedelta | None:
        return None if self.retry_after_ms < 0 else timedelta(milliseconds=self.retry_after_ms)

    @property
    def retry_after_seconds(self) -> int | None:
        if self.retry_after_ms < 0:
            return None
        return max(1, ceil_seconds(self.retry_after_ms))

    @property
    def binding(self) -> Result:
        """The most restrictive limiter: least remaining, then the longest wait, then the longest reset."""

        def wait(ms: int) -> float:
            return math.inf if ms < 0 else ms

        return min(self.limiters, key=lambda r: (r.remaining, -wait(r.retry_after_ms), -r.reset_after_ms))

    def __bool__(self) -> bool:
        return self.allowed

    def headers(self, *, binding_only: bool = False) -> dict[str, str]:
        """One ``RateLimit-Policy`` item per limiter; one ``RateLimit`` item per limiter too, or with
        ``binding_only`` the binding one's alone (the draft allows either); ``X-RateLimit-*`` from
        the binding one."""
        items = (self.binding,) if binding_only else self.limiters
        headers = _headers(self.allowed, self.retry_after_seconds, items, self.binding)
        if binding_only and "RateLimit-Policy" in headers:
            policies = _headers(self.allowed, self.retry_after_seconds, self.limiters, self.binding)
            headers["RateLimit-Policy"] = policies["RateLimit-Policy"]
        return headers


@dataclass(frozen=True)
class CellResult:
    """``CL.THROTTLE``'s reply, redis-cell's: seconds, and ``limited`` rather than allowed."""

    limited: bool
    limit: int
    remaining: int
    retry_after_s: int
    reset_after_s: int


def _item(name: str) -> str:
    escaped = name.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _headers(allowed: bool, retry_after_s: int | None, items: Sequence[Result], binding: Result) -> dict[str, str]:
    if any(r.degraded for r in items):
        # The server was not asked: no counts to report. Failing closed still
        # tells the client when to try again.
        return {} if allowed else {"Retry-After": "1"}
    headers: dict[str, str] = {}
    policies = [f"{_item(r.name)};q={r.limit};w={r.window_seconds}" for r in items if r.window_seconds is not None]
    if len(policies) == len(items):
        headers["RateLimit-Policy"] = ", ".join(policies)
    headers["RateLimit"] = ", ".join(
        f"{_item(r.name)};r={r.remaining};t={ceil_seconds(r.reset_after_ms)}" for r in items
    )
    headers["X-RateLimit-Limit"] = str(binding.limit)
    headers["X-RateLimit-Remaining"] = str(binding.remaining)
    headers["X-RateLimit-Reset"] = str(ceil_seconds(binding.reset_after_ms))
    if not allowed and retry_after_s is not None:
        headers["Retry-After"] = str(retry_after_s)
    return headers


def values(reply: Any) -> list[Any]:
    """A reply's values in order: RESP3 maps and RESP2 arrays alike."""
    if isinstance(reply, dict):
        return list(reply.values())
    return list(reply)


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def parse_result(reply: Any, *, name: str = "default", window_seconds: int | None = None) -> Result:
    """The standard five fields, with ``granted`` when there is a sixth (PARTIAL)."""
    v = values(reply)
    granted = int(v[5]) if len(v) > 5 else None
    return Result(
        bool(v[0]),
        int(v[1]),
        int(v[2]),
        int(v[3]),
        int(v[4]),
        granted=granted,
        name=name,
        window_seconds=window_seconds,
    )


def parse_lease(reply: Any) -> LeaseResult:
    v = values(reply)
    lease_id = None if v[5] is None else text(v[5])
    return LeaseResult(
        bool(v[0]), int(v[1]), int(v[2]), int(v[3]), int(v[4]), lease_id=lease_id, lease_ttl_ms=int(v[6])
    )


def parse_refund(reply: Any) -> RefundResult | None:
    if reply is None:
        return None
    v = values(reply)
    return RefundResult(bool(v[0]), int(v[1]), int(v[2]), int(v[3]), int(v[4]), refunded=int(v[5]))


def parse_all(reply: Any, names: Sequence[str], windows: Sequence[int | None]) -> AllResult:
    v = values(reply)
    granted = int(v[2]) if len(v) == 4 else None
    limiters = tuple(
        parse_result(item, name=name, window_seconds=w) for item, name, w in zip(v[-1], names, windows, strict=True)
    )
    return AllResult(bool(v[0]), int(v[1]), limiters, granted)


def parse_cell(reply: Any) -> CellResult:
    v = values(reply)
    return CellResult(bool(v[0]), int(v[1]), int(v[2]), int(v[3]), int(v[4]))


def parse_inspection(reply: Any) -> dict[str, Any] | None:
    """``RL.INSPECT``: a dict of the named fields (RESP3 gives the names, RESP2 the values only)."""
    if reply is None:
        return None
    if isinstance(reply, dict):
        return {text(k): (text(v) if isinstance(v, bytes) else v) for k, v in reply.items()}
    v = [text(x) if isinstance(x, bytes) else x for x in reply]
    return dict(zip(INSPECT_FIELDS[v[0]], v, strict=True))


INSPECT_FIELDS: dict[str, tuple[str, ...]] = {
    "tokenbucket": (
        "algorithm",
        "capacity",
        "refill_amount",
        "refill_period_ms",
        "tokens",
        "last_update_ms",
        "stored_level",
        "locked_until_ms",
    ),
    "window": ("algorithm", "limit", "period_ms", "window_start_ms", "window_ends_in_ms", "current", "locked_until_ms"),
    "window-sliding": (
        "algorithm",
        "limit",
        "period_ms",
        "window_start_ms",
        "window_ends_in_ms",
        "current",
        "previous",
        "locked_until_ms",
    ),
    "slidinglog": ("algorithm", "limit", "period_ms", "count", "entries", "oldest_ms", "newest_ms", "locked_until_ms"),
    "gcra": ("algorithm", "burst", "rate", "period_ms", "tat_ms", "locked_until_ms"),
    "lease": ("algorithm", "limit", "in_use", "leases", "locked_until_ms"),
    "calendar-window": (
        "algorithm",
        "limit",
        "unit",
        "anchor",
        "zone",
        "period_start_ms",
        "period_ends_in_ms",
        "current",
        "locked_until_ms",
    ),
}
