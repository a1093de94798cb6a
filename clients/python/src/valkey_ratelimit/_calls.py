"""Every command as a ``Call``: its arguments and how to read its reply.

The sync and asyncio clients only send these; everything that decides what
goes on the wire or comes back lives here, once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from . import results as r
from .limiters import Algorithm, Duration, Limiter, Policy, duration_arg, duration_ms, parse_definition

T = TypeVar("T")


@dataclass(frozen=True)
class Call(Generic[T]):
    args: tuple[str | int, ...]
    parse: Callable[[Any], T]
    #: What the failure policy answers when the server is unreachable
    #: (called with True to fail open, False to fail closed); None: raise.
    degraded: Callable[[bool], T] | None = None
    #: The server-side BLOCK timeout in ms (0: none), for the client-side one.
    block_ms: int | None = None
    #: Which cluster nodes take a keyless call (policies are per node):
    #: valkey-py's node flag ("primaries", "random"); None: routed by key.
    nodes: str | None = None


def _options(
    cost: int = 1,
    dry_run: bool = False,
    partial: bool = False,
    lockout: Duration | None = None,
    block: Duration | None = None,
) -> list[str | int]:
    out: list[str | int] = []
    if cost != 1:
        out += ["COST", cost]
    if dry_run:
        out.append("DRYRUN")
    if partial:
        out.append("PARTIAL")
    if lockout is not None:
        out += ["LOCKOUT", duration_arg(lockout)]
    if block is not None:
        out += ["BLOCK", _block_arg(block)]
    return out


def _block_arg(block: Duration) -> str:
    return "0" if duration_ms(block) == 0 else duration_arg(block)


def _degraded_result(name: str) -> Callable[[bool], r.Result]:
    return lambda allowed: r.Result(allowed, 0, 0, 0 if allowed else 1000, 0, name=name, degraded=True)


_COMMANDS = {"TOKENBUCKET": "RL.TOKENBUCKET", "WINDOW": "RL.WINDOW", "SLIDINGLOG": "RL.SLIDINGLOG", "GCRA": "RL.GCRA"}


def hit(
    key: str,
    limiter: Limiter,
    *,
    cost: int = 1,
    dry_run: bool = False,
    partial: bool = False,
    lockout: Duration | None = None,
    block: Duration | None = None,
    name: str = "default",
) -> Call[r.Result]:
    """One request of ``cost`` against ``limiter`` on ``key`` (``RL.LIMIT`` for a ``Policy``)."""
    options = _options(cost, dry_run, partial, lockout, block)
    if isinstance(limiter, Policy):
        args: list[str | int] = ["RL.LIMIT", key, limiter.name, *options]
        window = None
    else:
        kind, *params = limiter.args()
        args = [_COMMANDS[str(kind)], key, *params, *options]
        window = limiter.window_seconds()
    return Call(
        tuple(args),
        lambda reply: r.parse_result(reply, name=name, window_seconds=window),
        degraded=_degraded_result(name),
        block_ms=None if block is None else duration_ms(block),
    )


def all_of(
    items: Sequence[tuple[str, Limiter]],
    *,
    cost: int = 1,
    dry_run: bool = False,
    partial: bool = False,
    lockout: Duration | None = None,
    names: Sequence[str] | None = None,
) -> Call[r.AllResult]:
    """``RL.ALL``: one request against every (key, limiter), all or nothing."""
    if not items:
        raise ValueError("RL.ALL needs at least one (key, limiter)")
    labels = list(names) if names is not None else [f"l{i + 1}" for i in range(len(items))]
    if len(labels) != len(items):
        raise ValueError("one name per limiter")
    windows = [None if isinstance(lim, Policy) else lim.window_seconds() for _, lim in items]
    args: list[str | int] = ["RL.ALL", len(items), *(key for key, _ in items)]
    for _, limiter in items:
        args += limiter.args()
    args += _options(cost, dry_run, partial, lockout)

    def degraded(allowed: bool) -> r.AllResult:
        limiters = tuple(_degraded_result(n)(allowed) for n in labels)
        return r.AllResult(allowed, 0 if allowed else 1000, limiters)

    return Call(tuple(args), lambda reply: r.parse_all(reply, labels, windows), degraded=degraded)


def throttle(key: str, max_burst: int, count_per_period: int, period: Duration, quantity: int = 1) -> Call[r.Result]:
    """``RL.THROTTLE``: redis-cell's arguments, the standard reply."""
    window = max(1, -(-(max_burst + 1) * duration_ms(period) // count_per_period // 1000))
    return Call(
        ("RL.THROTTLE", key, max_burst, count_per_period, duration_arg(period), quantity),
        lambda reply: r.parse_result(reply, window_seconds=window),
        degraded=_degraded_result("default"),
    )


def cl_throttle(key: str, max_burst: int, count_per_period: int, period: int, quantity: int = 1) -> Call[r.CellResult]:
    """``CL.THROTTLE``: redis-cell's command and reply, unchanged."""
    return Call(
        ("CL.THROTTLE", key, max_burst, count_per_period, period, quantity),
        r.parse_cell,
        degraded=lambda allowed: r.CellResult(not allowed, 0, 0, -1 if allowed else 1, 0),
    )


def peek(key: str) -> Call[r.Result | None]:
    return Call(("RL.PEEK", key), lambda reply: None if reply is None else r.parse_result(reply))


def inspect(key: str) -> Call[dict[str, Any] | None]:
    return Call(("RL.INSPECT", key), r.parse_inspection)


def refund(key: str, amount: int) -> Call[r.RefundResult | None]:
    return Call(("RL.REFUND", key, amount), r.parse_refund)


def unlock(key: str) -> Call[bool]:
    return Call(("RL.UNLOCK", key), lambda reply: bool(reply))


def lease(
    key: str, limit: int, ttl: Duration, *, cost: int = 1, dry_run: bool = False, block: Duration | None = None
) -> Call[r.LeaseResult]:
    args = ["RL.LEASE", key, limit, duration_arg(ttl), *_options(cost, dry_run, block=block)]
    return Call(
        tuple(args),
        r.parse_lease,
        degraded=lambda allowed: r.LeaseResult(allowed, 0, 0, 0 if allowed else 1000, 0, degraded=True),
        block_ms=None if block is None else duration_ms(block),
    )


def release(key: str, lease_id: str) -> Call[bool]:
    return Call(("RL.RELEASE", key, lease_id), lambda reply: bool(reply))


def extend(key: str, lease_id: str, ttl: Duration) -> Call[bool]:
    return Call(("RL.EXTEND", key, lease_id, duration_arg(ttl)), lambda reply: bool(reply))


def policy_set(name: str, limiter: Algorithm) -> Call[bool]:
    return Call(("RL.POLICY.SET", name, *limiter.args()), lambda reply: True, nodes="primaries")


def policy_get(name: str) -> Call[Algorithm | None]:
    return Call(
        ("RL.POLICY.GET", name),
        lambda reply: None if reply is None else parse_definition([r.text(w) for w in reply]),
        nodes="random",
    )


def policy_del(*names: str) -> Call[int]:
    return Call(("RL.POLICY.DEL", *names), _deleted, nodes="primaries")


def _deleted(reply: Any) -> int:
    # From every primary of a cluster: a dict of node -> count; the largest.
    if isinstance(reply, dict):
        return max((int(v) for v in reply.values()), default=0)
    return int(reply)


def policy_list() -> Call[list[str]]:
    return Call(("RL.POLICY.LIST",), lambda reply: sorted(r.text(n) for n in reply), nodes="random")
