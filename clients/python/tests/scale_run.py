"""Many client processes against one global limit on a real cluster: what each mechanism admits.

Used by tests/test_scale_cluster.py (short runs, the limit must hold) and
bench/cluster_scale.py (longer runs, the figures in docs/scale.md).

Every process sends requests at a steady ``rate`` against one fixed-window
limit of ``limit`` per ``period_ms``, through one mechanism, and reports each
admission under the window it belongs to. An admission the server decided
belongs to the window the reply names (its end is now + ``reset_after_ms``);
one spent from a batch (``local``) to the window holding the moment the call
began, which is after the units were taken and before the batch's deadline,
so a batch spent in the wrong window shows up as a window over its limit.
Server calls are the cluster's own count (``INFO commandstats``) of RL
commands.
"""

from __future__ import annotations

import multiprocessing
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from valkey.cluster import ValkeyCluster

from valkey_ratelimit import DenyCache, RateLimiter, Result, SplitLimit, TokenBatcher, Window

Mechanism = Literal["direct", "deny-cache", "batching", "split", "split+deny-cache"]
MECHANISMS: tuple[Mechanism, ...] = ("direct", "deny-cache", "batching", "split", "split+deny-cache")


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


def _window_of(result: Result, began_ms: float, period_ms: int) -> int:
    if result.local:
        return int(began_ms // period_ms)
    return round((time.time() * 1000 + result.reset_after_ms) / period_ms) - 1


def _worker(ports: list[int], scenario: Scenario, start: float, seed: int) -> tuple[int, Counter[int]]:
    # valkey-py types its command methods only partly: the client is used as Any.
    client: Any = ValkeyCluster("127.0.0.1", ports[0])
    cache = DenyCache() if scenario.mechanism.endswith("deny-cache") else None
    limiter = RateLimiter(client, deny_cache=cache)
    limit = Window(scenario.limit, f"{scenario.period_ms}ms")
    batcher = (
        TokenBatcher(limiter, scenario.key, limit, max_batch=scenario.max_batch, target=scenario.target)
        if scenario.mechanism == "batching"
        else None
    )
    split = (
        SplitLimit(limiter, scenario.key, limit, scenario.shards, rng=random.Random(seed))
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
            began_ms = time.time() * 1000
            if batcher is not None:
                result = batcher.acquire()
            elif split is not None:
                result = split.hit()
            else:
                result = limiter.hit(scenario.key, limit)
            if result.allowed:
                admitted[_window_of(result, began_ms, scenario.period_ms)] += 1
    finally:
        if batcher is not None:
            batcher.close()
        client.close()
    return requests, admitted


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
