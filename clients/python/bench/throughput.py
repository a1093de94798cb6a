"""Hits per second through limits' strategies: its Redis storage (Lua) beside valkey-ratelimit's,
on one valkey-server with the module, in one run; then the memory of 10,000 moving-window keys
at their limit, filled by each storage's own commands.

    RL_MODULE=target/release/libvalkey_ratelimit.so PYTHONPATH=clients/python/tests \\
        target/clients-venv/bin/python clients/python/bench/throughput.py [--seconds 3] [--workers 4]

limits' Redis storage runs on redis-py (``redis://``), ours on valkey-py
(``valkey-ratelimit://``): each storage as a user gets it. Hits per second
are bound by the Python clients on a small machine; "server µs per hit"
(INFO commandstats: every command the server ran, divided by the hits) is
what each hit costs the server, the figure that decides how far one server
scales.
"""

from __future__ import annotations

import argparse
import random
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import limits.storage
import limits.strategies
from limits import parse
from servers import Server

import valkey_ratelimit.limits  # noqa: F401 -- registers valkey-ratelimit://

STRATEGIES = {
    "moving window": limits.strategies.MovingWindowRateLimiter,
    "sliding window counter": limits.strategies.SlidingWindowCounterRateLimiter,
}
ITEM = "100 per minute"
#: Many keys stay under the limit; few keys are at it, where most hits are denied.
KEY_COUNTS = {"under the limit": 1000, "at the limit": 10}
MEMORY_KEYS, MEMORY_LIMIT = 10_000, 10


def worker(uri: str, strategy: str, keys: int, seconds: float, seed: int) -> tuple[int, int]:
    """Hits for ``seconds`` on random keys: (hits, allowed)."""
    storage: Any = limits.storage.storage_from_string(uri)
    limiter = STRATEGIES[strategy](storage)
    item = parse(ITEM)
    rng = random.Random(seed)
    hits = allowed = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        allowed += limiter.hit(item, f"k{rng.randrange(keys)}")
        hits += 1
    return hits, allowed


def server_usec(client: Any) -> int:
    """Microseconds the server spent in commands since the last CONFIG RESETSTAT."""
    stats: dict[str, dict[str, Any]] = client.info("commandstats")
    return sum(int(s["usec"]) for name, s in stats.items() if name not in ("cmdstat_config", "cmdstat_info"))


def throughput(uri: str, strategy: str, keys: int, seconds: float, workers: int) -> tuple[float, float, int]:
    with ProcessPoolExecutor(workers) as pool:
        results = list(
            pool.map(
                worker, [uri] * workers, [strategy] * workers, [keys] * workers, [seconds] * workers, range(workers)
            )
        )
    hits = sum(h for h, _ in results)
    return hits / seconds, sum(a for _, a in results) / hits, hits


# valkey-py types its command methods only partly: the client is used as Any.
def used_memory(client: Any) -> int:
    info: dict[str, Any] = client.info("memory")
    return int(info["used_memory"])


def fill_ours(client: Any) -> None:
    for _ in range(MEMORY_LIMIT):
        pipe = client.pipeline(transaction=False)  # consecutive hits on a key are > 1 ms apart
        for k in range(MEMORY_KEYS):
            pipe.execute_command("RL.SLIDINGLOG", f"LIMITS:m{k}", MEMORY_LIMIT, "3600s", "BRIEF")
        pipe.execute()


def fill_lua(uri: str) -> None:
    storage: Any = limits.storage.storage_from_string(uri)
    script = storage.lua_acquire_moving_window
    for _ in range(MEMORY_LIMIT):
        pipe = storage.get_connection().pipeline(transaction=False)
        for k in range(MEMORY_KEYS):
            script(keys=[f"LIMITS:m{k}"], args=[time.time(), MEMORY_LIMIT, 3600, 1], client=pipe)
        pipe.execute()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement (default 3)")
    parser.add_argument("--workers", type=int, default=4, help="client processes (default 4)")
    args = parser.parse_args()
    with Server() as server:
        uris = {
            "limits RedisStorage (Lua)": f"redis://127.0.0.1:{server.port}",
            "valkey-ratelimit": f"valkey-ratelimit://127.0.0.1:{server.port}",
        }
        print(f"{ITEM} on random keys, {args.workers} client processes, {args.seconds:g} s each;")
        print(f"{server.client.info('server')['valkey_version']} with the module, one server for both\n")
        print("| strategy | keys | storage | hits/s | allowed | server µs per hit |\n|---|---|---|---:|---:|---:|")
        for strategy in STRATEGIES:
            for label, keys in KEY_COUNTS.items():
                for name, uri in uris.items():
                    server.client.flushall()
                    server.client.config_resetstat()
                    rate, allowed, hits = throughput(uri, strategy, keys, args.seconds, args.workers)
                    usec = server_usec(server.client) / hits
                    row = f"| {strategy} | {keys} ({label}) | {name} | {rate:,.0f} | {allowed:.0%} | {usec:.2f} |"
                    print(row, flush=True)

    print(
        f"\nMemory of {MEMORY_KEYS:,} moving-window keys at their limit ({MEMORY_LIMIT} per hour, one hit per key "
        "per round, by each storage's own command; a fresh server each):\n"
    )
    print("| storage | used_memory | per key | MEMORY USAGE per key |\n|---|---:|---:|---:|")
    for name in ("limits RedisStorage (Lua)", "valkey-ratelimit"):
        with Server() as fresh:
            before = used_memory(fresh.client)
            if name == "valkey-ratelimit":
                fill_ours(fresh.client)
            else:
                fill_lua(f"redis://127.0.0.1:{fresh.port}")
            assert fresh.client.dbsize() == MEMORY_KEYS
            grown = used_memory(fresh.client) - before
            sample = range(0, MEMORY_KEYS, 100)
            usage = sum(int(fresh.client.memory_usage(f"LIMITS:m{k}", samples=0)) for k in sample) / len(sample)
            per_key = grown / MEMORY_KEYS
            print(f"| {name} | {grown / 2**20:,.2f} MiB | {per_key:,.0f} B | {usage:,.0f} B |", flush=True)


if __name__ == "__main__":
    main()
