"""Many client processes against one global limit on a real cluster: what each mechanism admits.

Used by tests/test_scale_cluster.py (short runs, the limit must hold) and
bench/cluster_scale.py (longer runs, the figures in docs/scale.md).

Every process sends requests at a steady ``rate`` against one fixed-window
limit of ``limit`` per ``period_ms``, through one mechanism, and reports each
admission under the window it belongs to. An admission the server decided
belongs to the window the reply names (its end is now + ``reset_after_ms``);
one spent from a batch (``local``) to the window holding the moment the
batcher spent it (``SpendClock``), so a batch spent in the wrong window shows
up as a window over its limit. The ``-async`` mechanisms run ``COROUTINES``
coroutines per process on one asyncio client, each sending its part of the
rate, all at the same moments (so they meet on one batcher's fetch). Server
calls are the cluster's own count (``INFO commandstats``) of RL commands.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import time
from collections import Counter
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from valkey.asyncio.cluster import ValkeyCluster as AsyncValkeyCluster
from valkey.cluster import ValkeyCluster

from valkey_ratelimit import (
    AsyncRateLimiter,
    AsyncSplitLimit,
    AsyncTokenBatcher,
    BatchOptions,
    DenyCache,
    RateLimiter,
    Result,
    SplitLimit,
    TokenBatcher,
    Window,
)

Mechanism = Literal[
    "direct",
    "deny-cache",
    "batching",
    "split",
    "split+deny-cache",
    "split+batching",
    "batching-async",
    "split+batching-async",
]
MECHANISMS: tuple[Mechanism, ...] = get_args(Mechanism)
#: Coroutines per process of the ``-async`` mechanisms.
COROUTINES = 4


class SpendClock:
    """``time.monotonic`` for batchers, remembering per thread and per task its last reading.

    A batcher reads its clock last when it decides to spend held units, so
    after a local admission that reading is the moment it was spent: the
    window to count it in, whatever the caller waited for (a lock, a fetch
    made by another coroutine) before or after.
    """

    def __init__(self) -> None:
        self._last: ContextVar[float] = ContextVar("spent_at", default=0.0)
        self._wall_offset = time.time() - time.monotonic()

    def __call__(self) -> float:
        now = time.monotonic()
        self._last.set(now)
        return now

    def last_ms(self) -> float:
        """This thread's or task's last reading on the wall clock, in ms: the server's windows are on it."""
        return (self._last.get() + self._wall_offset) * 1000


def window_of(result: Result, spent_ms: float, period_ms: int) -> int:
    """The fixed window an admission belongs to: a local one's by when it was spent, a server's by its reply."""
    if result.local:
        return int(spent_ms // period_ms)
    return round((time.time() * 1000 + result.reset_after_ms) / period_ms) - 1


@dataclass(frozen=True)
class Scenario:
    mechanism: Mechanism
    processes: int = 4
    #: Requests per second each process sends (the demand is ``processes * rate``).
    rate: float = 150.0
    seconds: float = 2.0
    limit: int = 200
    period_ms: int = 1000
    shards: int = 3
    #: The batcher's bounds (None: its defaults, a tenth of the limit at most).
    max_batch: int | None = None
    target: float = 0.3
    key: str = "rl:scale"

    @property
    def demand(self) -> float:
        """Demand over the limit."""
        return self.processes * self.rate * self.period_ms / 1000 / self.limit


@dataclass
class Report:
    scenario: Scenario
    requests: int = 0
    admitted_by_window: Counter[int] = field(default_factory=Counter)
    #: The windows wholly inside the run (the utilisation is measured over these).
    full_windows: list[int] = field(default_factory=list)
    server_calls: int = 0

    @property
    def admitted(self) -> int:
        return sum(self.admitted_by_window.values())

    @property
    def worst_window(self) -> int:
        return max(self.admitted_by_window.values(), default=0)

    @property
    def utilisation(self) -> float:
        """Admitted per full window over the limit, averaged over the full windows."""
        if not self.full_windows:
            return 0.0
        admitted = sum(self.admitted_by_window[w] for w in self.full_windows)
        return admitted / (len(self.full_windows) * self.scenario.limit)

    @property
    def calls_per_admitted(self) -> float:
        return self.server_calls / max(1, self.admitted)


def _batch_options(scenario: Scenario, clock: SpendClock) -> BatchOptions:
    """The scenario's batch bounds; split over shares, ``max_batch`` is split too (the same units held)."""
    max_batch = scenario.max_batch
    if max_batch is not None and scenario.mechanism.startswith("split"):
        max_batch = max(1, max_batch // scenario.shards)
    return BatchOptions(max_batch=max_batch, target=scenario.target, clock=clock)


def _worker(ports: list[int], scenario: Scenario, start: float, seed: int) -> tuple[int, Counter[int]]:
    if scenario.mechanism.endswith("-async"):
        return asyncio.run(_async_worker(ports, scenario, start, seed))
    # valkey-py types its command methods only partly: the client is used as Any.
    client: Any = ValkeyCluster("127.0.0.1", ports[0])
    cache = DenyCache() if scenario.mechanism.endswith("deny-cache") else None
    limiter = RateLimiter(client, deny_cache=cache)
    limit = Window(scenario.limit, f"{scenario.period_ms}ms")
    clock = SpendClock()
    options = _batch_options(scenario, clock)
    batcher = (
        TokenBatcher(limiter, scenario.key, limit, **options.keywords()) if scenario.mechanism == "batching" else None
    )
    split = (
        SplitLimit(
            limiter,
            scenario.key,
            limit,
            scenario.shards,
            rng=random.Random(seed),
            batching=options if scenario.mechanism == "split+batching" else None,
        )
        if scenario.mechanism.startswith("split")
        else None
    )
    admitted: Counter[int] = Counter()
    requests = 0
    time.sleep(max(0.0, start - time.time()))
    end = start + scenario.seconds
    interval = 1 / scenario.rate
    try:
        while (now := time.time()) < end:
            due = start + requests * interval
            if due > now:
                time.sleep(due - now)
            elif now - due > 0.1:  # too far behind: steady demand, not a backlog
                requests = int((now - start) / interval)
            requests += 1
            if batcher is not None:
                result = batcher.acquire()
            elif split is not None:
                result = split.hit()
            else:
                result = limiter.hit(scenario.key, limit)
            if result.allowed:
                admitted[window_of(result, clock.last_ms(), scenario.period_ms)] += 1
    finally:
        if batcher is not None:
            batcher.close()
        if split is not None:
            split.close()
        client.close()
    return requests, admitted


async def _async_worker(ports: list[int], scenario: Scenario, start: float, seed: int) -> tuple[int, Counter[int]]:
    client = AsyncValkeyCluster(host="127.0.0.1", port=ports[0])
    limiter = AsyncRateLimiter(client)
    limit = Window(scenario.limit, f"{scenario.period_ms}ms")
    clock = SpendClock()
    options = _batch_options(scenario, clock)
    source: AsyncSplitLimit | AsyncTokenBatcher
    if scenario.mechanism.startswith("split"):
        rng = random.Random(seed)
        source = AsyncSplitLimit(limiter, scenario.key, limit, scenario.shards, rng=rng, batching=options)
    else:
        source = AsyncTokenBatcher(limiter, scenario.key, limit, **options.keywords())
    hit = source.hit if isinstance(source, AsyncSplitLimit) else source.acquire
    admitted: Counter[int] = Counter()
    end = start + scenario.seconds
    interval = COROUTINES / scenario.rate

    async def send() -> int:
        requests = 0
        while (now := time.time()) < end:
            due = start + requests * interval
            if due > now:
                await asyncio.sleep(due - now)
            elif now - due > 0.1:
                requests = int((now - start) / interval)
            requests += 1
            result = await hit()
            if result.allowed:
                admitted[window_of(result, clock.last_ms(), scenario.period_ms)] += 1
        return requests

    await asyncio.sleep(max(0.0, start - time.time()))
    try:
        sent = await asyncio.gather(*(send() for _ in range(COROUTINES)))
    finally:
        await source.aclose()
        await client.aclose()
    return sum(sent), admitted


def _rl_calls(ports: list[int]) -> int:
    import valkey

    total = 0
    for port in ports:
        node: Any = valkey.Valkey("127.0.0.1", port)
        stats = node.info("commandstats")
        total += sum(int(v["calls"]) for k, v in stats.items() if k.startswith("cmdstat_rl."))
        node.close()
    return total


def _reset_stats(ports: list[int]) -> None:
    import valkey

    for port in ports:
        node: Any = valkey.Valkey("127.0.0.1", port)
        node.config_resetstat()
        node.close()


def run(ports: list[int], scenario: Scenario) -> Report:
    """Run ``scenario`` on the cluster at ``ports``, its processes started together."""
    _reset_stats(ports)
    start = time.time() + 1.0  # the processes start, connect, then wait for this moment
    context = multiprocessing.get_context("fork")
    with context.Pool(scenario.processes) as pool:
        jobs = [pool.apply_async(_worker, (ports, scenario, start, seed)) for seed in range(scenario.processes)]
        outcomes = [job.get(timeout=scenario.seconds + 60) for job in jobs]
    report = Report(scenario)
    for requests, admitted in outcomes:
        report.requests += requests
        report.admitted_by_window.update(admitted)
    period = scenario.period_ms
    first = int(start * 1000 // period) + 1
    last = int((start + scenario.seconds) * 1000 // period) - 1
    report.full_windows = list(range(first, last + 1))
    report.server_calls = _rl_calls(ports)
    return report
