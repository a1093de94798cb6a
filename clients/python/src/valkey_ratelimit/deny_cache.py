"""A local deny cache: a key the server denied stays denied here until its ``retry_after_ms``.

During an attack most requests on a hot key are denied, and each denial costs a
round trip to the one primary that holds the key. The server's denial says
exactly how long it lasts, so the client can answer the same question itself
until then (envoy ratelimit's "local cache of keys over their limit").

What a denial proves, and so what is denied locally:

- A denial of cost ``c`` says nothing about a smaller cost: only requests of
  cost ``>= c`` are denied locally. A ``partial`` request is denied by the
  server only when not one unit is there, so it proves "cost 1 is denied" and
  denies every later request; a partial request is answered locally only
  from such a denial (it needs one unit).
- The statement holds only for the same limiter definition and the same
  ``LOCKOUT`` option (a denied call with ``LOCKOUT`` locks the key on the
  server; answering it here must not skip that), so both are part of the
  cache key.
- Without refunds, every limiter refills monotonically and other clients only
  take more, so nothing the server would admit is denied here. The one
  trade-off: an ``RL.REFUND``, ``RL.UNLOCK``, ``DEL`` or a new policy made by
  *another* process is not seen until the denial runs out. This process's own
  ``refund`` and ``unlock`` forget the key.
- Not cached: ``Policy`` limiters (the stored definition can change under
  the same name, and may log denials), ``SlidingLog(count_denied=True)``
  (the server logs each denied request, which a local denial would skip),
  ``block=`` calls (they wait on the server), degraded results and denials
  that can never pass (``retry_after_ms`` -1: the caller's bug, not traffic).

Time is ``time.monotonic()``, never the wall clock. The deadline is counted
from the moment the request was *sent* (the server decided later, so its
deadline is later), less ``slack_ms`` for the server's rounding up to whole
milliseconds and its per-command cached clock. Memory is bounded: at most
``max_keys`` entries, the least recently used evicted first.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from .limiters import Duration, Limiter, Policy, SlidingLog, duration_ms
from .results import Result


@dataclass(frozen=True)
class Query:
    """One ``hit`` as the cache sees it; ``DenyCache.query`` builds it (None: not cacheable)."""

    key: str
    limiter: Limiter
    lockout_ms: int | None
    #: The cost a denial of this request proves denied, and the cost this request needs.
    cost: int
    dry_run: bool
    partial: bool
    name: str


@dataclass
class _Denial:
    deny_until: float
    retry_at: float
    reset_at: float
    cost: int
    limit: int
    remaining: int


class DenyCache:
    """Denials remembered per (key, limiter, lockout), until their ``retry_after_ms``; thread-safe.

    Give one to ``RateLimiter(client, deny_cache=DenyCache())`` (or the async
    client): that limiter's ``hit`` calls consult it. Off unless given; one
    cache can serve several limiters of one process.
    """

    def __init__(
        self, max_keys: int = 10_000, *, slack_ms: int = 2, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be at least 1")
        self.max_keys = max_keys
        self.slack_ms = slack_ms
        self.clock = clock
        self._entries: OrderedDict[tuple[str, Limiter, int | None], _Denial] = OrderedDict()
        self._lock = threading.Lock()
        #: Requests answered locally, for metrics.
        self.local_denials = 0

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def query(
        key: str,
        limiter: Limiter,
        *,
        cost: int,
        dry_run: bool,
        partial: bool,
        lockout: Duration | None,
        block: Duration | None,
        name: str,
    ) -> Query | None:
        """The request as a cache query; None for the calls the cache must not answer (see the module)."""
        if block is not None or isinstance(limiter, Policy):
            return None
        if isinstance(limiter, SlidingLog) and limiter.count_denied:
            return None
        lockout_ms = None if lockout is None else duration_ms(lockout)
        return Query(key, limiter, lockout_ms, 1 if partial else cost, dry_run, partial, name)

    def check(self, query: Query) -> Result | None:
        """The local denial for ``query``, or None: ask the server."""
        now = self.clock()
        entry_key = (query.key, query.limiter, query.lockout_ms)
        with self._lock:
            denial = self._entries.get(entry_key)
            if denial is None:
                return None
            if now >= denial.deny_until:
                del self._entries[entry_key]
                return None
            if query.cost < denial.cost:
                return None
            self._entries.move_to_end(entry_key)
            self.local_denials += 1
        retry_ms = max(1, math.ceil((denial.retry_at - now) * 1000))
        reset_ms = max(retry_ms, math.ceil((denial.reset_at - now) * 1000))
        limiter = query.limiter
        return Result(
            False,
            denial.limit,
            denial.remaining,
            retry_ms,
            reset_ms,
            granted=0 if query.partial else None,
            name=query.name,
            window_seconds=None if isinstance(limiter, Policy) else limiter.window_seconds(),
            local=True,
        )

    def record(self, query: Query, sent_at: float, result: Result) -> None:
        """Learn from the server's answer to ``query``, sent at ``sent_at`` (``clock()``)."""
        if result.allowed or result.degraded or result.retry_after_ms < 0:
            return
        if query.dry_run and query.lockout_ms is not None:
            return  # a dry run does not lock: it cannot stand for a call that would
        retry_at = sent_at + result.retry_after_ms / 1000
        denial = _Denial(
            deny_until=retry_at - self.slack_ms / 1000,
            retry_at=retry_at,
            reset_at=sent_at + result.reset_after_ms / 1000,
            cost=query.cost,
            limit=result.limit,
            remaining=result.remaining,
        )
        if denial.deny_until <= sent_at:
            return
        entry_key = (query.key, query.limiter, query.lockout_ms)
        with self._lock:
            self._entries[entry_key] = denial
            self._entries.move_to_end(entry_key)
            while len(self._entries) > self.max_keys:
                self._entries.popitem(last=False)

    def forget(self, key: str) -> None:
        """Drop every denial of ``key`` (after a refund or unlock made by this process)."""
        with self._lock:
            for entry_key in [k for k in self._entries if k[0] == key]:
                del self._entries[entry_key]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
