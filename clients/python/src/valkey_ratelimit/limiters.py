"""What a limiter is: one small immutable description per algorithm.

They build the arguments of the algorithm's command (``RL.TOKENBUCKET``,
``RL.WINDOW``, ``RL.SLIDINGLOG``, ``RL.GCRA``), of an ``RL.ALL`` item and of
``RL.POLICY.SET``, and know their window for the ``RateLimit-Policy`` header.
``Policy`` names a limiter stored on the server (``RL.LIMIT``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta

#: A duration: seconds (int or float), a ``timedelta``, or the module's own
#: syntax (``"250ms"``, ``"15m"``, ``"1d"``).
Duration = int | float | timedelta | str

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def duration_ms(value: Duration) -> int:
    """A duration in whole milliseconds (rounded up: a wait is never shortened)."""
    if isinstance(value, timedelta):
        return math.ceil(value / timedelta(milliseconds=1))
    if isinstance(value, bool):
        raise TypeError("a duration cannot be a bool")
    if isinstance(value, (int, float)):
        return math.ceil(value * 1000)
    text = value.strip().lower()
    for unit in ("ms", "s", "m", "h", "d"):
        if text.endswith(unit) and text[: -len(unit)].isdigit():
            return int(text[: -len(unit)]) * _UNITS_MS[unit]
    if text.isdigit():
        return int(text) * 1000
    raise ValueError(f"not a duration: {value!r} (seconds, a timedelta, or e.g. '250ms', '15m')")


def normalized(value: Duration) -> timedelta:
    """A duration as a ``timedelta``, so that ``Window(5, 60) == Window(5, "1m")``."""
    return timedelta(milliseconds=duration_ms(value))


def duration_arg(value: Duration) -> str:
    """The argument the module parses: always in milliseconds, so it is exact."""
    return f"{duration_ms(value)}ms"


@dataclass(frozen=True)
class TokenBucket:
    """``capacity`` tokens, refilled at ``refill_amount`` per ``refill_period``."""

    capacity: int
    refill_amount: int
    refill_period: Duration

    def __post_init__(self) -> None:
        object.__setattr__(self, "refill_period", normalized(self.refill_period))

    def args(self) -> list[str | int]:
        return ["TOKENBUCKET", self.capacity, self.refill_amount, duration_arg(self.refill_period)]

    def window_seconds(self) -> int:
        """Time to refill from empty to full."""
        ms = self.capacity * duration_ms(self.refill_period) / self.refill_amount
        return max(1, math.ceil(ms / 1000))


@dataclass(frozen=True)
class Window:
    """``limit`` per ``period``: fixed windows, or with ``sliding`` a sliding window counter."""

    limit: int
    period: Duration
    sliding: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "period", normalized(self.period))

    def args(self) -> list[str | int]:
        return ["WINDOW", self.limit, duration_arg(self.period), *(["SLIDING"] if self.sliding else [])]

    def window_seconds(self) -> int:
        return max(1, math.ceil(duration_ms(self.period) / 1000))


@dataclass(frozen=True)
class SlidingLog:
    """Exactly ``limit`` per any ``period``; ``count_denied`` logs denied requests too."""

    limit: int
    period: Duration
    count_denied: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "period", normalized(self.period))

    def args(self) -> list[str | int]:
        flag = ["COUNTDENIED"] if self.count_denied else []
        return ["SLIDINGLOG", self.limit, duration_arg(self.period), *flag]

    def window_seconds(self) -> int:
        return max(1, math.ceil(duration_ms(self.period) / 1000))


@dataclass(frozen=True)
class Gcra:
    """GCRA: ``rate`` per ``period`` on an even schedule, bursts of ``burst``."""

    burst: int
    rate: int
    period: Duration

    def __post_init__(self) -> None:
        object.__setattr__(self, "period", normalized(self.period))

    def args(self) -> list[str | int]:
        return ["GCRA", self.burst, self.rate, duration_arg(self.period)]

    def window_seconds(self) -> int:
        """Time to earn a whole burst back."""
        return max(1, math.ceil(self.burst * duration_ms(self.period) / self.rate / 1000))


@dataclass(frozen=True)
class Policy:
    """A limiter stored on the server by ``RL.POLICY.SET`` under ``name``."""

    name: str

    def args(self) -> list[str | int]:
        return ["POLICY", self.name]


#: A limiter that can be stored as a policy.
Algorithm = TokenBucket | Window | SlidingLog | Gcra
#: Anything that can limit a key: an algorithm or a stored policy.
Limiter = TokenBucket | Window | SlidingLog | Gcra | Policy


def limit_size(limit: Algorithm) -> int:
    """How many units the limiter holds when full: its ``limit``, ``capacity`` or ``burst``."""
    if isinstance(limit, TokenBucket):
        return limit.capacity
    if isinstance(limit, Gcra):
        return limit.burst
    return limit.limit


def parse_definition(words: list[str]) -> Algorithm:
    """``RL.POLICY.GET``'s reply (the definition as given) back into a limiter."""
    kind, *rest = (w.upper() for w in words)
    params = [w for w in words[1:]]
    if kind == "TOKENBUCKET":
        return TokenBucket(int(params[0]), int(params[1]), params[2])
    if kind == "WINDOW":
        return Window(int(params[0]), params[1], sliding="SLIDING" in rest[2:])
    if kind == "SLIDINGLOG":
        return SlidingLog(int(params[0]), params[1], count_denied="COUNTDENIED" in rest[2:])
    if kind == "GCRA":
        return Gcra(int(params[0]), int(params[1]), params[2])
    raise ValueError(f"unknown policy definition: {words!r}")
