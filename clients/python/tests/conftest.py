"""One standalone server and one single-node cluster per session; clients of each kind."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import valkey
import valkey.asyncio as avalkey
from servers import Server
from valkey.asyncio.cluster import ValkeyCluster as AsyncValkeyCluster
from valkey.cluster import ValkeyCluster

from valkey_ratelimit import AsyncRateLimiter, RateLimiter


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    with Server() as s:
        yield s


@pytest.fixture(scope="session")
def cluster_server() -> Iterator[Server]:
    with Server(cluster=True) as s:
        yield s


@pytest.fixture(params=["standalone", "cluster"])
def limiter(request: pytest.FixtureRequest, server: Server, cluster_server: Server) -> Iterator[RateLimiter]:
    if request.param == "standalone":
        server.client.flushall()
        client: valkey.Valkey | ValkeyCluster = valkey.Valkey("127.0.0.1", server.port)
    else:
        cluster_server.client.flushall()
        client = ValkeyCluster("127.0.0.1", cluster_server.port)
    yield RateLimiter(client)
    client.close()


@pytest.fixture(params=["standalone", "cluster"])
async def alimiter(
    request: pytest.FixtureRequest, server: Server, cluster_server: Server
) -> AsyncIterator[AsyncRateLimiter]:
    if request.param == "standalone":
        server.client.flushall()
        client: avalkey.Valkey | AsyncValkeyCluster = avalkey.Valkey(host="127.0.0.1", port=server.port)
    else:
        cluster_server.client.flushall()
        client = AsyncValkeyCluster(host="127.0.0.1", port=cluster_server.port)
    yield AsyncRateLimiter(client)
    await client.aclose()


@pytest.fixture(params=["standalone", "cluster"])
async def aconnect(
    request: pytest.FixtureRequest, server: Server, cluster_server: Server
) -> AsyncIterator[Callable[[], AsyncRateLimiter]]:
    """Makes async limiters, each on a client (connections) of its own: several processes' worth."""
    target = server if request.param == "standalone" else cluster_server
    target.client.flushall()
    clients: list[avalkey.Valkey | AsyncValkeyCluster] = []

    def connect() -> AsyncRateLimiter:
        if request.param == "standalone":
            clients.append(avalkey.Valkey(host="127.0.0.1", port=target.port))
        else:
            clients.append(AsyncValkeyCluster(host="127.0.0.1", port=target.port))
        return AsyncRateLimiter(clients[-1])

    yield connect
    for client in clients:
        await client.aclose()
