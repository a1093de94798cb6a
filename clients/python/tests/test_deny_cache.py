"""The local deny cache: denies locally only what the server would deny, until the server's retry."""

from __future__ import annotations

import random

import pytest
from pytest_mock import MockerFixture

from valkey_ratelimit import AsyncRateLimiter, DenyCache, Policy, RateLimiter, SlidingLog, TokenBucket, Window
from valkey_ratelimit.limiters import Limiter


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def cached(limiter: RateLimiter, cache: DenyCache) -> RateLimiter:
    return RateLimiter(limiter.client, deny_cache=cache)


def test_a_denied_key_is_denied_locally_until_the_retry(limiter: RateLimiter, mocker: MockerFixture) -> None:
    clock = FakeClock()
    rl = cached(limiter, DenyCache(clock=clock))
    spec = TokenBucket(2, 1, "1h")
    assert rl.hit("k", spec, cost=2).allowed
    denied = rl.hit("k", spec)
    assert not denied.allowed and not denied.local
    sent = mocker.spy(rl._client, "execute_command")
    local = rl.hit("k", spec)
    assert not local.allowed and local.local
    assert sent.call_count == 0
    assert local.retry_after_ms == denied.retry_after_ms  # the fake clock stood still
    assert local.limit == 2 and local.headers()["Retry-After"] == denied.headers()["Retry-After"]
    clock.now += denied.retry_after_ms / 1000  # the retry has come: ask the server again
    assert not rl.hit("k", spec).local


def test_a_denial_says_nothing_about_a_smaller_cost(limiter: RateLimiter) -> None:
    rl = cached(limiter, DenyCache())
    spec = TokenBucket(5, 1, "1h")
    assert rl.hit("c", spec, cost=3).allowed
    assert not rl.hit("c", spec, cost=3).allowed  # 2 left
    assert rl.hit("c", spec, cost=4).local  # more than the denied cost: local
    smaller = rl.hit("c", spec, cost=2)
    assert smaller.allowed and not smaller.local
    # Partial needs one unit: a denial of cost 3 does not prove that; a partial denial does.
    assert not rl.hit("c", spec, cost=3, partial=True).local
    assert rl.hit("c", spec, cost=1).local


def test_the_definition_and_lockout_are_part_of_the_cache_key(limiter: RateLimiter) -> None:
    rl = cached(limiter, DenyCache())
    assert rl.hit("d", Window(1, "1h")).allowed
    assert not rl.hit("d", Window(1, "1h")).allowed
    assert rl.hit("d", Window(1, "1h")).local
    assert not rl.hit("d", Window(1, "1h"), lockout="10m").local  # must lock on the server
    assert rl.hit("d", Window(1, "1h"), lockout="10m").local
    assert not rl.hit("d", Window(2, "1h")).local


def test_policies_logged_denials_and_never_are_not_cached(limiter: RateLimiter) -> None:
    rl = cached(limiter, DenyCache())
    limiter.policy_set("p1", Window(1, "1h"))
    log = SlidingLog(1, "1h", count_denied=True)
    pairs: list[tuple[str, Limiter]] = [("pol", Policy("p1")), ("log", log)]
    for key, spec in pairs:
        assert rl.hit(key, spec).allowed
        assert [rl.hit(key, spec).local for _ in range(2)] == [False, False], key
    assert [rl.hit("never", Window(1, "1h"), cost=2).local for _ in range(2)] == [False, False]
    limiter.policy_del("p1")


def test_memory_is_bounded_least_recently_used_first(limiter: RateLimiter) -> None:
    cache = DenyCache(max_keys=2)
    rl = cached(limiter, cache)
    spec = Window(1, "1h")
    for key in ("a", "b", "c"):
        rl.hit(key, spec)
        rl.hit(key, spec)
    assert len(cache) == 2
    assert not rl.hit("a", spec).local  # evicted
    assert rl.hit("c", spec).local


def test_own_refund_and_unlock_forget_the_key(limiter: RateLimiter) -> None:
    rl = cached(limiter, DenyCache())
    spec = Window(1, "1h")
    rl.hit("r", spec)
    assert not rl.hit("r", spec).allowed
    rl.refund("r", 1)
    assert rl.hit("r", spec).allowed


def test_never_denies_locally_what_the_server_would_admit(limiter: RateLimiter) -> None:
    """Random traffic on slow limiters (retries of minutes: no race with the clock); every local
    denial is checked against the server by a dry run of the same request."""
    rng = random.Random(23)
    cache = DenyCache()
    rl = cached(limiter, cache)
    specs: list[Limiter] = [
        TokenBucket(10, 1, "1m"),
        Window(10, "1h"),
        Window(10, "1h", sliding=True),
        SlidingLog(10, "1h"),
    ]
    local = 0
    for _ in range(400):
        key = f"x{rng.randrange(3)}"
        spec = specs[int(key[1])]
        cost, partial = rng.randint(1, 6), rng.random() < 0.3
        result = rl.hit(key, spec, cost=cost, partial=partial)
        if result.local:
            local += 1
            server = limiter.hit(key, spec, cost=cost, partial=partial, dry_run=True)
            assert not server.allowed, (key, cost, partial)
        if rng.random() < 0.05:
            # A refund made elsewhere is the documented trade-off: this test forgets the key itself.
            limiter.refund(key, rng.randint(1, 5))
            cache.forget(key)
    assert local > 50


async def test_the_async_client_uses_it_too(alimiter: AsyncRateLimiter) -> None:
    rl = AsyncRateLimiter(alimiter.client, deny_cache=DenyCache())
    spec = Window(1, "1h")
    assert (await rl.hit("a", spec)).allowed
    assert not (await rl.hit("a", spec)).local
    assert (await rl.hit("a", spec)).local


def test_max_keys_must_be_positive() -> None:
    with pytest.raises(ValueError):
        DenyCache(max_keys=0)
