"""What a decision is when the server cannot answer: the failure policy.

``"raise"`` (the default) raises ``UnavailableError``. ``"open"`` allows the
request and ``"closed"`` denies it (``Retry-After: 1``); either way the result
is marked ``degraded`` and carries no counts, so no RateLimit headers are
sent for it. Only unavailability is covered (connection refused or lost, a
timeout, a node loading, failing over or a cluster down): an error reply
about the call itself (bad arguments, WRONGTYPE, a missing policy) is a bug
and always raises its typed exception.
"""

from __future__ import annotations

from typing import Literal, TypeVar

from valkey import exceptions as vex

from ._calls import Call
from .errors import RateLimitError, TryAgainError, UnavailableError, from_response

OnUnavailable = Literal["raise", "open", "closed"]

UNAVAILABLE: tuple[type[BaseException], ...] = (
    vex.ConnectionError,
    vex.TimeoutError,
    vex.ClusterDownError,
    vex.MasterDownError,
    vex.ReadOnlyError,
    TimeoutError,
)

T = TypeVar("T")


def check_policy(on_unavailable: str) -> OnUnavailable:
    if on_unavailable not in ("raise", "open", "closed"):
        raise ValueError(f"on_unavailable must be 'raise', 'open' or 'closed', not {on_unavailable!r}")
    return on_unavailable  # type: ignore[return-value]


def translate(exc: BaseException) -> BaseException | None:
    """The typed exception for a server error reply; None when it is not one of ours."""
    if isinstance(exc, vex.TryAgainError):
        return TryAgainError(f"TRYAGAIN {exc}")
    if isinstance(exc, vex.ResponseError) and not isinstance(exc, UNAVAILABLE):
        return from_response(exc)
    return None


def on_failure(call: Call[T], exc: BaseException, policy: OnUnavailable) -> T:
    """The degraded answer the policy gives for ``exc``, or the exception to raise."""
    typed = translate(exc)
    if typed is not None:
        raise typed from exc
    if not isinstance(exc, UNAVAILABLE):
        raise exc
    if policy == "raise" or call.degraded is None:
        raise UnavailableError(f"{call.args[0]}: {exc!r}") from exc
    return call.degraded(policy == "open")


__all__ = ["UNAVAILABLE", "OnUnavailable", "RateLimitError", "check_policy", "on_failure", "translate"]
