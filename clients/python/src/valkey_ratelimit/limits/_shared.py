"""What the sync and async ``limits`` storages send and how they read it.

Mapping of ``limits``' strategies onto the module, one command per hit:

- moving window: ``RL.SLIDINGLOG key limit period COST n BRIEF`` (an exact
  log; ``get_moving_window`` reads ``RL.INSPECT``: count and oldest entry);
- sliding window counter: ``RL.WINDOW key limit period SLIDING COST n BRIEF``
  (windows aligned to the epoch, like ``limits``' timestamp-keyed storages;
  ``get_sliding_window`` reads the two counts from ``RL.INSPECT``);
- fixed window: ``limits`` asks for a bare counter (``incr`` has no limit),
  so it is a plain ``INCRBY`` plus ``EXPIRE ... NX`` in one transaction: one
  round trip, no Lua.

Time is the server's clock (milliseconds), never the application's.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import valkey
from limits.errors import ConfigurationError

from ..results import parse_inspection

PREFIX = "LIMITS"
#: Our scheme -> valkey-py's, for ``from_url``.
URL_SCHEMES = {"valkey-ratelimit": "valkey", "valkey-ratelimits": "valkeys"}


def client_url(uri: str) -> str:
    """``valkey-ratelimit[s]://...`` (any ``async+`` prefix or ``+cluster`` suffix dropped) as valkey-py's URL."""
    parts = urlsplit(uri)
    scheme = parts.scheme.removeprefix("async+").removesuffix("+cluster")
    if scheme not in URL_SCHEMES:
        raise ConfigurationError(f"not a valkey-ratelimit URI: {uri}")
    return urlunsplit(parts._replace(scheme=URL_SCHEMES[scheme]))


def cluster_nodes(uri: str) -> list[tuple[str, int]]:
    """The startup nodes of ``valkey-ratelimit+cluster://[user:pass@]host:port,host:port``."""
    netloc = urlsplit(uri).netloc.rpartition("@")[2]
    nodes = []
    for location in netloc.split(","):
        host, _, port = location.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ConfigurationError(f"missing host or port in {location!r} of {uri}")
        nodes.append((host.strip("[]"), int(port)))
    return nodes


def credentials(uri: str) -> dict[str, Any]:
    parts = urlsplit(uri)
    out: dict[str, Any] = {}
    if parts.username:
        out["username"] = parts.username
    if parts.password:
        out["password"] = parts.password
    if parts.scheme.removeprefix("async+").startswith("valkey-ratelimits"):
        out["ssl"] = True
    return out


class ModuleKeys:
    """Keys and errors, the same for the sync and async storages."""

    key_prefix: str

    @property
    def base_exceptions(self) -> type[Exception] | tuple[type[Exception], ...]:
        return valkey.exceptions.ValkeyError

    def prefixed_key(self, key: str) -> str:
        return f"{self.key_prefix}:{key}"

    def sliding_key(self, key: str) -> str:
        """The sliding window counter's key: apart from the moving window's and the counter's."""
        return f"{self.key_prefix}:{key}:sliding"


def period(expiry: int) -> str:
    return f"{int(expiry)}s"


def cost(amount: int) -> tuple[Any, ...]:
    """``COST n``, left out for the default 1: the server parses two arguments less."""
    return () if amount == 1 else ("COST", amount)


def moving_window_args(key: str, limit: int, expiry: int, amount: int) -> tuple[Any, ...]:
    return ("RL.SLIDINGLOG", key, limit, period(expiry), *cost(amount), "BRIEF")


def sliding_window_args(key: str, limit: int, expiry: int, amount: int) -> tuple[Any, ...]:
    return ("RL.WINDOW", key, limit, period(expiry), "SLIDING", *cost(amount), "BRIEF")


def brief_allowed(reply: Any) -> bool:
    """``BRIEF``'s reply is 0 when the request was allowed."""
    return int(reply) == 0


def moving_window(reply: Any) -> tuple[float, int]:
    """``RL.INSPECT`` of a sliding log as (start of the window, entries in it)."""
    state = parse_inspection(reply)
    if state is None or state["algorithm"] != "slidinglog" or not state["count"]:
        return time.time(), 0
    return int(state["oldest_ms"]) / 1000, int(state["count"])


def sliding_window(reply: Any) -> tuple[int, float, int, float]:
    """``RL.INSPECT`` of a sliding window counter as ``limits`` wants it: (previous count, how long
    it still weighs, current count, how long it weighs).

    The module allows a hit while ``estimate + cost <= limit`` exactly, where ``limits``' own
    storages allow it while ``floor(estimate) + cost <= limit``; read raw, the two counts would
    make ``limits`` report one unit too many as remaining and a reset up to ``period / limit``
    too early (a ``Retry-After`` the next request does not meet). So the state is reported as
    its equivalent under ``limits``' formulas: no previous count, a current count of
    ``ceil(estimate)``, and a current expiry whose remainder modulo the period is the time until
    one more hit fits (while the limiter is full) or until the current window ends (while it is
    not). ``limits`` cannot express a reset more than one period away (its formula takes the
    remainder modulo the period); that wait, at most ``period + period / limit``, is reported
    as just under one period.
    """
    state = parse_inspection(reply)
    if state is None or state["algorithm"] != "window-sliding":
        return 0, 0.0, 0, 0.0
    limit, previous, current = int(state["limit"]), int(state["previous"]), int(state["current"])
    period_ms, ends_in_ms = int(state["period_ms"]), int(state["window_ends_in_ms"])
    # The module's integer estimate, times the period: the previous window weighs what is left of this one.
    used = previous * ends_in_ms + current * period_ms
    count = -(-used // period_ms)
    full = used + period_ms > limit * period_ms
    wait_ms = ready_in_ms(limit, previous, current, period_ms, ends_in_ms) if full else ends_in_ms
    wait_ms = min(wait_ms, period_ms - 1)
    return 0, 0.0, count, (period_ms + wait_ms) / 1000


def ready_in_ms(limit: int, previous: int, current: int, period_ms: int, ends_in_ms: int) -> int:
    """How long until one more hit fits, with no other traffic: as the module's ``retry_after_ms``."""

    def fits_after(window_starts_in: int, weighing: int, room: int) -> int:
        # Within a window that carries `weighing`, a hit fits from elapsed time e where
        # weighing * (period - e) <= room * period.
        if weighing == 0:
            return window_starts_in
        slack = min(room * period_ms // weighing, period_ms)
        return window_starts_in + period_ms - slack

    if current + 1 <= limit:
        return max(fits_after(ends_in_ms - period_ms, previous, limit - current - 1), 0)
    return fits_after(ends_in_ms, current, limit - 1)


def expiry_at(pttl: Any) -> float:
    return time.time() + max(int(pttl), 0) / 1000
