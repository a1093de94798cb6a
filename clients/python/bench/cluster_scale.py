"""Utilisation and server calls per admitted request on a real 3-primary cluster, per mechanism.

Starts three valkey-server primaries with the module on loopback, then for
each demand level and mechanism runs ``--processes`` client processes against
one fixed-window limit (tests/scale_run.py) and prints a Markdown table:
utilisation (admitted per whole window / limit), server calls (RL commands
counted by the servers) per admitted request, and the busiest window, which
must never exceed the limit.

    RL_MODULE=target/release/libvalkey_ratelimit.so PYTHONPATH=clients/python/tests \\
      target/clients-venv/bin/python clients/python/bench/cluster_scale.py --seconds 6
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from scale_run import MECHANISMS, Scenario, run
from servers import Cluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--limit", type=int, default=200, help="per 1 s window")
    parser.add_argument("--demands", type=float, nargs="+", default=[1.2, 3.0], help="demand / limit")
    args = parser.parse_args()
    print(f"{args.processes} processes, limit {args.limit} per 1 s window, {args.seconds:g} s per run, 3 primaries\n")
    print("| demand | mechanism | utilisation | server calls per admitted | busiest window | requests |")
    print("|---:|---|---:|---:|---:|---:|")
    with Cluster(primaries=3) as cluster:
        for demand in args.demands:
            base = Scenario(
                "direct",
                processes=args.processes,
                rate=demand * args.limit / args.processes,
                seconds=args.seconds,
                limit=args.limit,
            )
            for mechanism in MECHANISMS:
                report = run(cluster.ports, replace(base, mechanism=mechanism, key=f"rl:bench:{demand}:{mechanism}"))
                assert report.worst_window <= args.limit, f"{mechanism}: a window admitted {report.worst_window}"
                print(
                    f"| {demand:g}x | {mechanism} | {report.utilisation:.3f} | {report.calls_per_admitted:.3f} "
                    f"| {report.worst_window} | {report.requests} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
