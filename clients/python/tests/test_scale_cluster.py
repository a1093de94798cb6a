"""Proof on a real cluster: three primaries, four client processes, one global limit.

Demand is three times the limit, and 1.2 times with large batches (units are
then still held when a window ends: spending them in the next one would show).
The mechanisms include split budgets with a batcher per share, and the
asyncio batchers (four coroutines per process on one client, meeting on one
batcher's fetch). Whatever the mechanism, no window may admit more than the
limit; batching and the deny cache must save server calls.
(Utilisation is measured, not asserted: it depends on how fast this machine
lets the processes send; bench/cluster_scale.py reports it.)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from scale_run import MECHANISMS, Report, Scenario, run
from servers import Cluster
from valkey.cluster import ValkeyCluster

from valkey_ratelimit import shard_keys


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster(primaries=3) as c:
        yield c


#: Three times the limit; 1.2 times it, with batches of up to a quarter of the limit.
DEMANDS = {"3x": Scenario("direct", rate=150), "1.2x": Scenario("direct", rate=60, max_batch=50)}


@pytest.fixture(scope="module")
def reports(cluster: Cluster) -> dict[tuple[str, str], Report]:
    return {
        (m, d): run(cluster.ports, replace(s, mechanism=m, key=f"rl:scale:{d}:{m}", seconds=2.0))
        for d, s in DEMANDS.items()
        for m in MECHANISMS
    }


def test_split_keys_live_on_three_primaries(cluster: Cluster) -> None:
    client: Any = ValkeyCluster("127.0.0.1", cluster.ports[0])
    nodes = {client.get_node_from_key(key).name for key in shard_keys("rl:scale:split", 3)}
    client.close()
    assert len(nodes) == 3


@pytest.mark.parametrize("demand", DEMANDS)
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_no_window_admits_more_than_the_limit(
    reports: dict[tuple[str, str], Report], mechanism: str, demand: str
) -> None:
    report = reports[mechanism, demand]
    assert report.full_windows, "the run must cover a whole window"
    over = {w: n for w, n in report.admitted_by_window.items() if n > report.scenario.limit}
    assert not over, f"{mechanism}: windows over the limit of {report.scenario.limit}: {over}"
    assert report.admitted > 0


def test_batching_and_the_deny_cache_save_server_calls(reports: dict[tuple[str, str], Report]) -> None:
    def calls(mechanism: str) -> float:
        return reports[mechanism, "3x"].calls_per_admitted

    # Three times the limit: without help every request is a call, admitted or not.
    assert calls("direct") > 1.5
    assert calls("deny-cache") < calls("direct") / 1.5
    assert calls("split+deny-cache") < calls("split") / 1.5
    assert calls("batching") < 0.5
    assert calls("batching-async") < 0.5
    # Per-share batches are a third of the size (a tenth of a share), and a denied share is asked again.
    assert calls("split+batching") < 1.0
    assert calls("split+batching-async") < 1.0
