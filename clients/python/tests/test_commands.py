"""Every command through the sync client, standalone and cluster, against a real server."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import valkey
from servers import Server

from valkey_ratelimit import (
    CommandError,
    Gcra,
    LeaseNotGrantedError,
    Policy,
    PolicyNotFoundError,
    RateLimiter,
    SlidingLog,
    TokenBucket,
    Window,
    WrongTypeError,
    same_slot,
)


def test_token_bucket_allows_its_capacity_then_denies(limiter: RateLimiter) -> None:
    bucket = TokenBucket(3, 1, "10s")
    results = [limiter.hit("tb", bucket) for _ in range(4)]
    assert [r.allowed for r in results] == [True, True, True, False]
    denied = results[-1]
    assert (denied.limit, denied.remaining) == (3, 0)
    assert 9_000 < denied.retry_after_ms <= 10_000
    assert denied.retry_after == timedelta(milliseconds=denied.retry_after_ms)
    assert not denied


def test_every_algorithm_counts(limiter: RateLimiter) -> None:
    for key, spec in [
        ("w", Window(2, 60)),
        ("sw", Window(2, timedelta(minutes=1), sliding=True)),
        ("log", SlidingLog(2, "1m")),
        ("g", Gcra(2, 1, "1m")),
    ]:
        assert [limiter.hit(key, spec).allowed for _ in range(3)] == [True, True, False], key


def test_cost_dry_run_and_never(limiter: RateLimiter) -> None:
    spec = TokenBucket(10, 1, "1m")
    assert limiter.hit("k", spec, cost=4, dry_run=True).remaining == 6
    assert limiter.hit("k", spec, cost=4).remaining == 6
    never = limiter.hit("k", spec, cost=11)
    assert not never.allowed and never.retry_after is None and never.retry_after_seconds is None
    assert "Retry-After" not in never.headers()


def test_partial_grants_what_is_there(limiter: RateLimiter) -> None:
    spec = TokenBucket(10, 1, "1m")
    assert limiter.hit("p", spec, cost=7, partial=True).granted == 7
    second = limiter.hit("p", spec, cost=7, partial=True)
    assert second.allowed and second.granted == 3 and second.remaining == 0


def test_lockout_and_unlock(limiter: RateLimiter) -> None:
    spec = SlidingLog(1, "1h")
    assert limiter.hit("lk", spec, lockout="10m").allowed
    denied = limiter.hit("lk", spec, lockout="10m")
    assert not denied.allowed and denied.retry_after_ms > 590_000
    state = limiter.inspect("lk")
    assert state is not None and state["locked_until_ms"] is not None
    assert limiter.unlock("lk") is True
    assert limiter.unlock("lk") is False


def test_headers_round_up_and_follow_the_draft(limiter: RateLimiter) -> None:
    spec = Window(1, "90s")
    ok = limiter.hit("h", spec, name="api")
    assert ok.headers()["RateLimit-Policy"] == '"api";q=1;w=90'
    denied = limiter.hit("h", spec, name="api")
    h = denied.headers()
    assert h["Retry-After"] == str(-(-denied.retry_after_ms // 1000))
    assert h["RateLimit"] == f'"api";r=0;t={-(-denied.reset_after_ms // 1000)}'
    assert (h["X-RateLimit-Limit"], h["X-RateLimit-Remaining"]) == ("1", "0")
    assert h["X-RateLimit-Reset"] == str(-(-denied.reset_after_ms // 1000))


def test_all_is_all_or_nothing_on_one_slot(limiter: RateLimiter) -> None:
    burst, daily = same_slot("user:7", "burst", "daily")
    items = [(burst, TokenBucket(2, 1, "1m")), (daily, Window(3, "1d"))]
    assert limiter.all(items, names=["burst", "daily"]).allowed
    assert limiter.all(items, names=["burst", "daily"]).allowed
    denied = limiter.all(items, names=["burst", "daily"])
    assert not denied.allowed and denied.retry_after_ms > 0
    assert [r.remaining for r in denied.limiters] == [0, 1]  # the window kept its third unit
    assert denied.binding.name == "burst"
    h = denied.headers()
    assert h["RateLimit-Policy"] == '"burst";q=2;w=120, "daily";q=3;w=86400'
    assert h["RateLimit"].startswith('"burst";r=0;t=') and '"daily";r=1;t=' in h["RateLimit"]
    assert h["X-RateLimit-Limit"] == "2"
    binding = denied.headers(binding_only=True)
    assert binding["RateLimit"].startswith('"burst";r=0;t=') and "daily" not in binding["RateLimit"]
    assert binding["RateLimit-Policy"] == h["RateLimit-Policy"]


def test_same_slot_refuses_braces() -> None:
    with pytest.raises(ValueError):
        same_slot("a{b", "x")


def test_throttle_and_cl_throttle(limiter: RateLimiter) -> None:
    first = limiter.throttle("t", 1, 1, 60)
    assert first.allowed and first.limit == 2
    cell = limiter.cl_throttle("c", 0, 1, 60)
    assert (cell.limited, cell.limit, cell.retry_after_s) == (False, 1, -1)
    again = limiter.cl_throttle("c", 0, 1, 60)
    assert again.limited and again.retry_after_s > 0


def test_peek_inspect_refund(limiter: RateLimiter) -> None:
    assert limiter.peek("none") is None and limiter.inspect("none") is None and limiter.refund("none", 1) is None
    limiter.hit("r", TokenBucket(10, 1, "1h"), cost=5)
    peek = limiter.peek("r")
    assert peek is not None and peek.remaining == 5
    refund = limiter.refund("r", 3)
    assert refund is not None and refund.refunded == 3 and refund.remaining == 8
    state = limiter.inspect("r")
    assert state is not None and state["algorithm"] == "tokenbucket" and state["tokens"] == 8
    assert state["stored_level"] // state["refill_period_ms"] == 8 and state["last_update_ms"] > 0
    limiter.client.execute_command("RL.WINDOW", "cal", 5, "month", "TZ", "Europe/Berlin", "ANCHOR", 31)
    month = limiter.inspect("cal")
    assert month is not None and (month["algorithm"], month["zone"], month["anchor"]) == (
        "calendar-window",
        "Europe/Berlin",
        31,
    )
    assert month["current"] == 1 and 0 < month["period_ends_in_ms"] <= 31 * 86_400_000


def test_leases_and_hold(limiter: RateLimiter) -> None:
    first = limiter.lease("jobs", 2, "30s")
    assert first.allowed and first.lease_id is not None and first.lease_ttl_ms == 30_000
    assert limiter.extend("jobs", first.lease_id, "60s")
    with limiter.hold("jobs", 2, "30s") as held:
        assert held.remaining == 0
        with pytest.raises(LeaseNotGrantedError):
            with limiter.hold("jobs", 2, "30s"):
                pass
    assert limiter.release("jobs", first.lease_id) is True
    assert limiter.release("jobs", first.lease_id) is False
    state = limiter.inspect("jobs")
    assert state is None or state["in_use"] == 0


def test_hold_extends_while_held(limiter: RateLimiter) -> None:
    with limiter.hold("beat", 1, "300ms"):
        time.sleep(0.7)  # more than twice the TTL: only the heartbeat keeps it
        state = limiter.inspect("beat")
        assert state is not None and state["in_use"] == 1
    assert limiter.lease("beat", 1, "1s").allowed


def test_policies(limiter: RateLimiter) -> None:
    limiter.policy_set("api", Window(2, "1m", sliding=True))
    assert limiter.policy_get("api") == Window(2, "1m", sliding=True)
    assert limiter.policy_list() == ["api"]
    assert limiter.hit("pk", Policy("api")).remaining == 1
    burst, daily = same_slot("u", "a", "b")
    assert limiter.all([(burst, Policy("api")), (daily, Gcra(5, 5, "1s"))]).allowed
    assert limiter.policy_del("api", "other") == 1
    assert limiter.policy_get("api") is None
    with pytest.raises(PolicyNotFoundError, match="no policy named"):
        limiter.hit("pk", Policy("api"))


def test_errors_keep_the_server_message(limiter: RateLimiter) -> None:
    with pytest.raises(CommandError, match="capacity must be an integer from 1 to"):
        limiter.hit("e", TokenBucket(0, 1, "1s"))
    limiter.hit("e", Window(1, "1m"))
    with pytest.raises(WrongTypeError, match="WRONGTYPE key holds a fixed window"):
        limiter.hit("e", SlidingLog(1, "1m"))


def test_block_waits_for_the_permit(limiter: RateLimiter) -> None:
    spec = Gcra(1, 10, "1s")
    assert limiter.hit("b", spec).allowed
    start = time.monotonic()
    waited = limiter.hit("b", spec, block="2s")
    assert waited.allowed and 0.05 < time.monotonic() - start < 1.5


def test_resp3_replies_parse_the_same(server: Server) -> None:
    server.client.flushall()
    client = valkey.Valkey("127.0.0.1", server.port, protocol=3)
    limiter = RateLimiter(client)
    assert limiter.hit("r3", TokenBucket(2, 1, "1m"), cost=3, partial=True).granted == 2
    keys = same_slot("r3", "a", "b")
    both = limiter.all([(keys[0], Window(1, "1m")), (keys[1], SlidingLog(1, "1m"))], partial=True)
    assert both.allowed and both.granted == 1 and [r.limit for r in both.limiters] == [1, 1]
    lease = limiter.lease("r3l", 1, "10s")
    assert lease.lease_id is not None and lease.lease_ttl_ms == 10_000
    refund = limiter.refund("r3", 1)
    assert refund is not None and refund.refunded == 1
    state = limiter.inspect(keys[1])
    assert state is not None and state["algorithm"] == "slidinglog" and state["count"] == 1
    client.close()
