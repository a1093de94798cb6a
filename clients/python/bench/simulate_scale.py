"""A seeded simulation of many client processes sharing one limit split over shards.

Pure Python, deterministic for a given ``--seed``: 1,000 client processes by
default, each sending Poisson traffic (together ``--demand`` times the limit)
against one fixed-window limit split into ``--shards`` keys (split budgets:
shares summing to the limit, a random shard, a second choice on denial).
Each process either calls the server per request (with or without the deny
cache) or batches units as ``valkey_ratelimit.batching`` does: ``COST n
PARTIAL`` on a random shard (a second on a denial), spent locally until the
window ends, the rest refunded ``delay`` before it, only the exact need taken
in that last stretch, a denial kept locally until ``min(retry, recheck)``.
The server is modelled as the module's fixed window (a refund after the
window changed lands in the new window, as on the server). The network
delay is a round trip, half each way.

Prints a Markdown table, utilisation (admitted per whole window / limit) and
server calls per admitted request against batch size and delay, and writes a
plot when matplotlib can be imported (``--plot``).

    python3 clients/python/bench/simulate_scale.py --seed 23 --plot docs/scale-sim.png
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: Batch sizes: 0 is no batching (a server call per request), "adaptive" follows the rate.
NO_BATCH = 0
ADAPTIVE = -1


@dataclass(frozen=True)
class Config:
    clients: int = 1000
    shards: int = 10
    limit: int = 10_000
    period: float = 1.0
    demand: float = 1.5
    seconds: float = 6.0
    delay: float = 0.002
    batch: int = NO_BATCH
    deny_cache: bool = True
    target: float = 0.3
    max_batch: int = 100
    seed: int = 23


@dataclass
class Client:
    held: int = 0
    #: The shard the held units came from (a process takes again only when it holds none).
    shard: int = 0
    spend_until: float = 0.0
    refund_by: float = 0.0
    denied_until: float = 0.0
    in_flight: bool = False
    waiting: int = 0
    rate: float = 0.0
    last_use: float = 0.0
    #: Deny cache per shard (no batching): denied until.
    shard_denied: dict[int, float] = field(default_factory=dict)


@dataclass
class Outcome:
    admitted: Counter[int] = field(default_factory=Counter)
    calls: int = 0
    calls_by_shard: Counter[int] = field(default_factory=Counter)


class Simulation:
    def __init__(self, config: Config) -> None:
        self.c = config
        self.rng = random.Random(config.seed)
        base, extra = divmod(config.limit, config.shards)
        self.share = [base + (1 if i < extra else 0) for i in range(config.shards)]
        self.used = [0] * config.shards
        self.window = [-1] * config.shards
        self.clients = [Client() for _ in range(config.clients)]
        self.events: list[tuple[float, int, Callable[[float], None]]] = []
        self.seq = 0
        self.out = Outcome()

    # -- plumbing
    def at(self, t: float, action: Callable[[float], None]) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, action))

    def window_of(self, t: float) -> int:
        return int(t // self.c.period)

    def admit(self, t: float, n: int = 1) -> None:
        self.out.admitted[self.window_of(t)] += n

    # -- the server: the module's fixed window
    def _advance(self, shard: int, t: float) -> None:
        w = self.window_of(t)
        if self.window[shard] != w:
            self.window[shard], self.used[shard] = w, 0

    def serve(self, shard: int, t: float, cost: int, partial: bool) -> tuple[int, float]:
        """(granted, reset/retry seconds): the window's end from ``t``."""
        self._advance(shard, t)
        self.out.calls += 1
        self.out.calls_by_shard[shard] += 1
        left = self.share[shard] - self.used[shard]
        granted = min(cost, left) if partial else (cost if cost <= left else 0)
        self.used[shard] += granted
        return granted, (self.window_of(t) + 1) * self.c.period - t

    def refund(self, shard: int, t: float, amount: int) -> None:
        self._advance(shard, t)
        self.out.calls += 1
        self.out.calls_by_shard[shard] += 1
        self.used[shard] -= min(amount, self.used[shard])

    # -- traffic
    def run(self) -> Outcome:
        rate = self.c.demand * self.c.limit / self.c.period / self.c.clients
        for i in range(self.c.clients):
            self.at(self.rng.expovariate(rate), self._arrival(i, rate))
        while self.events:
            t, _, action = heapq.heappop(self.events)
            if t > self.c.seconds:
                break
            action(t)
        return self.out

    def _arrival(self, i: int, rate: float) -> Callable[[float], None]:
        def arrive(t: float) -> None:
            self.at(t + self.rng.expovariate(rate), arrive)
            if self.c.batch == NO_BATCH:
                self._direct(i, t)
            else:
                self._batched(i, t)

        return arrive

    def _picks(self) -> tuple[int, int]:
        first, second = self.rng.sample(range(self.c.shards), 2)
        return first, second

    # -- no batching: one call per request, a second shard on denial
    def _direct(self, i: int, t: float) -> None:
        client, half = self.clients[i], self.c.delay / 2
        picks = [s for s in self._picks() if not (self.c.deny_cache and client.shard_denied.get(s, 0.0) > t)]

        def ask(k: int, t_sent: float) -> None:
            if k == len(picks):
                return  # denied (locally, or by both picks)
            shard = picks[k]

            def at_server(ts: float) -> None:
                granted, retry = self.serve(shard, ts, 1, False)

                def back(tr: float) -> None:
                    if granted:
                        self.admit(ts)  # the server decided in its window
                    else:
                        client.shard_denied[shard] = t_sent + retry
                        ask(k + 1, tr)

                self.at(ts + half, back)

            self.at(t_sent + half, at_server)

        ask(0, t)

    # -- batching
    def _batch_size(self, client: Client) -> int:
        if self.c.batch != ADAPTIVE:
            return self.c.batch
        return min(self.c.max_batch, max(1, math.ceil(client.rate * self.c.target)))

    def _batched(self, i: int, t: float) -> None:
        client = self.clients[i]
        client.rate = client.rate * math.exp(-(t - client.last_use)) + 1.0  # tau = 1 s
        client.last_use = t
        if client.held and t >= client.spend_until:
            client.held = 0  # stale: may not be spent in the next window
        if client.held:
            client.held -= 1
            self.admit(t)
            return
        if t < client.denied_until:
            return
        client.waiting += 1
        if not client.in_flight:
            self._take(i, t, self._picks())

    def _take(self, i: int, t: float, picks: tuple[int, ...]) -> None:
        client, half = self.clients[i], self.c.delay / 2
        shard = picks[0]
        last_stretch = client.refund_by <= t < client.spend_until
        ask = client.waiting if last_stretch else max(client.waiting, self._batch_size(client))
        client.in_flight = True

        def at_server(ts: float) -> None:
            granted, reset = self.serve(shard, ts, ask, True)

            def back(tr: float) -> None:
                client.in_flight = False
                spend_until = t + reset  # counted from sending: the window's end less half the delay
                if granted:
                    served = min(granted, client.waiting)
                    self.admit(tr, served)
                    client.waiting -= served
                    client.held = granted - served
                    client.shard = shard
                    client.spend_until = spend_until
                    client.refund_by = spend_until - self.c.delay
                    if client.held:
                        self.at(
                            max(tr, client.refund_by - self.c.delay), self._refund_before_end(i, client.spend_until)
                        )
                    if client.waiting:
                        self._take(i, tr, self._picks())
                elif len(picks) > 1:
                    self._take(i, tr, picks[1:])
                else:
                    client.denied_until = t + min(reset, self.c.target)
                    client.waiting = 0

            self.at(ts + half, back)

        self.at(t + half, at_server)

    def _refund_before_end(self, i: int, spend_until: float) -> Callable[[float], None]:
        def refund(t: float) -> None:
            client = self.clients[i]
            if client.held and client.spend_until == spend_until and t < client.refund_by:
                amount, client.held, shard = client.held, 0, client.shard
                self.at(t + self.c.delay / 2, lambda ts: self.refund(shard, ts, amount))

        return refund


@dataclass(frozen=True)
class Row:
    config: Config
    utilisation: float
    calls_per_admitted: float
    busiest_shard_calls_per_s: float
    worst_window: float


def measure(config: Config) -> Row:
    out = Simulation(config).run()
    whole = range(1, int(config.seconds / config.period))
    admitted = sum(out.admitted[w] for w in whole)
    limit = config.limit * len(whole)
    busiest = max(out.calls_by_shard.values(), default=0) / config.seconds
    worst = max((out.admitted[w] for w in whole), default=0) / config.limit
    return Row(config, admitted / limit, out.calls / max(1, sum(out.admitted.values())), busiest, worst)


def label(batch: int, deny_cache: bool) -> str:
    if batch == NO_BATCH:
        return "none, deny cache" if deny_cache else "none"
    return "adaptive" if batch == ADAPTIVE else str(batch)


def plot(rows: list[Row], path: str) -> None:
    try:
        import importlib

        matplotlib: Any = importlib.import_module("matplotlib")
        matplotlib.use("Agg")
        plt: Any = importlib.import_module("matplotlib.pyplot")
    except ImportError:
        print(f"\nmatplotlib is not importable: no plot written to {path}")
        return
    fig: Any
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for delay in sorted({r.config.delay for r in rows}):
        mine = [r for r in rows if r.config.delay == delay]
        names = [label(r.config.batch, r.config.deny_cache) for r in mine]
        left.plot(names, [r.utilisation for r in mine], marker="o", label=f"{delay * 1000:g} ms")
        right.plot(names, [r.calls_per_admitted for r in mine], marker="o", label=f"{delay * 1000:g} ms")
    left.set(title="utilisation (admitted / limit)", xlabel="batch size", ylim=(0, 1.05))
    right.set(title="server calls per admitted request", xlabel="batch size", yscale="log")
    for ax in (left, right):
        ax.legend(title="round trip")
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"\nplot written to {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seed", type=int, default=23)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--shards", type=int, default=10)
    parser.add_argument("--limit", type=int, default=10_000, help="per 1 s window")
    parser.add_argument("--demand", type=float, default=1.5, help="demand / limit")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--delays-ms", type=float, nargs="+", default=[0.2, 2.0, 20.0])
    parser.add_argument("--batches", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--plot", metavar="PNG")
    args = parser.parse_args()
    base = Config(args.clients, args.shards, args.limit, 1.0, args.demand, args.seconds, seed=args.seed)
    kinds = [(NO_BATCH, False), (NO_BATCH, True), *((b, True) for b in args.batches), (ADAPTIVE, True)]
    print(
        f"{args.clients} clients, {args.shards} shards, limit {args.limit} per 1 s window, demand {args.demand:g}x, "
        f"{args.seconds:g} s, seed {args.seed}\n"
    )
    print("| round trip | batch | utilisation | server calls per admitted | busiest shard, calls/s | busiest window |")
    print("|---:|---|---:|---:|---:|---:|")
    rows = []
    for delay_ms in args.delays_ms:
        for batch, deny_cache in kinds:
            config = Config(**{**base.__dict__, "delay": delay_ms / 1000, "batch": batch, "deny_cache": deny_cache})
            row = measure(config)
            rows.append(row)
            print(
                f"| {delay_ms:g} ms | {label(batch, deny_cache)} | {row.utilisation:.3f} | "
                f"{row.calls_per_admitted:.3f} | {row.busiest_shard_calls_per_s:,.0f} | {row.worst_window:.3f} |",
                flush=True,
            )
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
