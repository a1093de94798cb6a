"""Rate limiting for ASGI apps (FastAPI, Starlette) with valkey-ratelimit's RL.ALL.

Copy this file into your service. It depends on `valkey` (valkey-py) only;
`RateLimitMiddleware` is plain ASGI, so it works under FastAPI, Starlette or
any ASGI framework:

    limiter = RateLimiter(make_client(config), config)
    app.add_middleware(RateLimitMiddleware, limiter=limiter, paths=("/api/",))

Every request under `paths` is charged to two limiters in one atomic call:
its API key (a GCRA: bursts of `key_burst`, `key_rate` per `key_period`)
and its client IP (a sliding window: `ip_limit` per `ip_period`). The
contract (headers, status codes, failure policy) is examples/README.md's.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import valkey.asyncio as valkey
from valkey.asyncio.retry import Retry
from valkey.backoff import NoBackoff

log = logging.getLogger("rate_limit")

# Longer API keys are refused (401) before any Valkey call: one request must
# not be able to create a huge key.
MAX_API_KEY_BYTES = 256

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class RateLimitConfig:
    """The knobs, with the defaults every recipe shares (examples/README.md)."""

    valkey_addr: str = "127.0.0.1:6379"
    prefix: str = "rl:v1:api"  # bump the version to start from fresh limiters
    key_burst: int = 5  # per API key: GCRA burst ...
    key_rate: int = 5  # ... and sustained rate of key_rate per key_period seconds
    key_period: int = 1
    ip_limit: int = 20  # per client IP: sliding window of ip_limit per ip_period seconds
    ip_period: int = 60
    trusted_proxies: tuple[str, ...] = ()  # IPs or CIDRs whose X-Forwarded-For we believe
    failure_mode: str = "open"  # "open": serve when Valkey fails; "closed": answer 503
    timeout_ms: int = 50  # connect and command timeout; the whole call is cut at 2 * timeout_ms

    def __post_init__(self) -> None:
        if self.failure_mode not in ("open", "closed"):
            raise ValueError(f"failure_mode must be 'open' or 'closed', not {self.failure_mode!r}")
        for name in ("key_burst", "key_rate", "key_period", "ip_limit", "ip_period", "timeout_ms"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> RateLimitConfig:
        """The knobs from environment variables; unset, empty or blank ones keep their default."""
        env = os.environ if env is None else env
        d = cls()

        def get(name: str, default: str) -> str:
            return env.get(name, "").strip() or default

        def num(name: str, default: int) -> int:
            value = get(name, str(default))
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"{name} must be an integer of at least 1, not {value!r}") from None

        proxies = tuple(p.strip() for p in get("RL_TRUSTED_PROXIES", "").split(",") if p.strip())
        return cls(
            valkey_addr=get("VALKEY_ADDR", d.valkey_addr),
            prefix=get("RL_PREFIX", d.prefix),
            key_burst=num("RL_KEY_BURST", d.key_burst),
            key_rate=num("RL_KEY_RATE", d.key_rate),
            key_period=num("RL_KEY_PERIOD", d.key_period),
            ip_limit=num("RL_IP_LIMIT", d.ip_limit),
            ip_period=num("RL_IP_PERIOD", d.ip_period),
            trusted_proxies=proxies,
            failure_mode=get("RL_FAILURE_MODE", d.failure_mode),
            timeout_ms=num("RL_TIMEOUT_MS", d.timeout_ms),
        )


def make_client(config: RateLimitConfig) -> valkey.Valkey:
    """A client that gives up quickly: a limiter must never be the slow part of a request.

    Both timeouts are `timeout_ms`, and there are no retries (valkey-py's
    default, spelled out): a retry would double what a down Valkey costs.
    A connection that failed or timed out is dropped and the next request
    connects anew. RateLimiter.check also cuts the whole call (connect,
    handshake, command) at 2 * timeout_ms: that is what a down or hung
    Valkey costs a request, at most.
    """
    host, _, port = config.valkey_addr.rpartition(":")
    timeout = config.timeout_ms / 1000
    return valkey.Valkey(
        host=host.strip("[]") or "127.0.0.1",
        port=int(port),
        socket_connect_timeout=timeout,
        socket_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
        retry_on_timeout=False,
        protocol=2,  # the reply shapes below are RESP2's
    )


@dataclass(frozen=True)
class Limiter:
    """One limiter's five fields from the RL.ALL reply."""

    name: str
    allowed: bool
    limit: int
    remaining: int
    retry_after_ms: int
    reset_after_ms: int


@dataclass(frozen=True)
class Decision:
    allowed: bool
    retry_after_ms: int
    limiters: tuple[Limiter, ...]
    policy: str = field(repr=False)

    @property
    def binding(self) -> Limiter:
        """The most restrictive limiter: least remaining, then the longest wait (-1, "never",
        counts as the longest), then the longest reset, then the first."""

        def wait(ms: int) -> float:
            return math.inf if ms < 0 else ms

        # min() keeps the first of equal elements: `key` wins a full tie.
        return min(self.limiters, key=lambda l: (l.remaining, -wait(l.retry_after_ms), -l.reset_after_ms))

    @property
    def retry_after_s(self) -> int | None:
        """Retry-After in whole seconds, rounded up and at least 1; None when it can never pass."""
        if self.retry_after_ms < 0:
            return None
        return max(1, ceil_seconds(self.retry_after_ms))

    def headers(self) -> list[tuple[str, str]]:
        """The rate-limit headers, for 200 and 429 alike (draft-ietf-httpapi-ratelimit-headers, -07 and later)."""
        b = self.binding
        reset = str(ceil_seconds(b.reset_after_ms))
        headers = [
            ("RateLimit-Policy", self.policy),
            ("RateLimit", f'"{b.name}";r={b.remaining};t={reset}'),
            ("X-RateLimit-Limit", str(b.limit)),
            ("X-RateLimit-Remaining", str(b.remaining)),
            ("X-RateLimit-Reset", reset),
        ]
        if not self.allowed and self.retry_after_s is not None:
            headers.append(("Retry-After", str(self.retry_after_s)))
        return headers


def ceil_seconds(ms: int) -> int:
    """Milliseconds to whole seconds, rounded up: a client that waits that long is never early."""
    return -(-ms // 1000)


class RateLimiter:
    """Decides one request: both limiters in one RL.ALL call."""

    def __init__(self, client: valkey.Valkey, config: RateLimitConfig) -> None:
        self.client = client
        self.config = config
        c = config
        # The GCRA's window is the time to earn a whole burst back; the
        # sliding window's is its period. One item per limiter, in call order.
        key_window = math.ceil(c.key_burst * c.key_period / c.key_rate)
        self.policy = f'"key";q={c.key_burst};w={key_window}, "ip";q={c.ip_limit};w={c.ip_period}'
        self._gcra = ("GCRA", c.key_burst, c.key_rate, f"{c.key_period}s")
        self._window = ("WINDOW", c.ip_limit, f"{c.ip_period}s", "SLIDING")
        # The client's own timeouts bound each step; this bounds the whole
        # call (connect, handshake, command): at most 2 * timeout_ms.
        self._deadline = 2 * c.timeout_ms / 1000

    async def check(self, api_key: str, client_ip: str) -> Decision:
        """Charge one request; raises on any failure (the caller applies the failure policy)."""
        p = self.config.prefix
        # RL.ALL decides both limiters atomically: a request denied by one
        # consumes from neither. In Valkey Cluster all keys of one RL.ALL must
        # hash to one slot (else CROSSSLOT): these two do not. There, put one
        # hash tag in both keys (f"{p}:{{key:{api_key}}}" and
        # f"{p}:{{key:{api_key}}}:ip:{client_ip}", which limits per key and
        # IP), or make two calls (RL.GCRA, then RL.WINDOW) and lose the
        # all-or-nothing. In standalone Valkey any keys work.
        reply = await asyncio.wait_for(
            self.client.execute_command(
                "RL.ALL", 2, f"{p}:key:{api_key}", f"{p}:ip:{client_ip}", *self._gcra, *self._window
            ),
            self._deadline,
        )
        return self._parse(reply)

    def _parse(self, reply: Any) -> Decision:
        # RESP2: [allowed, retry_after_ms, [[allowed, limit, remaining, retry_after_ms, reset_after_ms], ...]]
        allowed, retry_after_ms, items = reply
        if len(items) != 2:
            raise ValueError(f"unexpected RL.ALL reply: {reply!r}")
        limiters = tuple(
            Limiter(name, bool(a), int(lim), int(rem), int(retry), int(reset))
            for name, (a, lim, rem, retry, reset) in zip(("key", "ip"), items)
        )
        return Decision(bool(allowed), int(retry_after_ms), limiters, self.policy)


def parse_networks(entries: Iterable[str]) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(e, strict=False) for e in entries)


def normalize_ip(text: str) -> IPAddress | None:
    try:
        ip = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    # An IPv4 client seen through a dual-stack socket is still that IPv4 client.
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def client_ip(peer: str | None, forwarded_for: str | None, trusted: tuple[IPNetwork, ...]) -> str:
    """The address to limit: the peer's, unless the peer is a trusted proxy.

    Anyone can send X-Forwarded-For, so it is read only when the direct peer
    is one of our proxies, and then from the right: each proxy appends the
    address it saw, so the rightmost entries are the ones our proxies wrote,
    and the first address that is not one of them is the client. Entries left
    of it were written by the client itself and prove nothing.
    """
    ip = normalize_ip(peer) if peer else None
    if ip is None:
        return "unknown"  # e.g. a Unix socket: all such requests share one IP limit

    def is_trusted(a: IPAddress) -> bool:
        return any(a in net for net in trusted)

    if not is_trusted(ip) or not forwarded_for:
        return str(ip)
    for entry in reversed(forwarded_for.split(",")):
        hop = normalize_ip(entry)
        if hop is None:
            break  # garbage: stop at the last hop we could vouch for
        ip = hop
        if not is_trusted(hop):
            break
    return str(ip)


class RateLimitMiddleware:
    """ASGI middleware: 401 without an API key, 429 when limited, headers on every decision."""

    def __init__(self, app: Callable[..., Awaitable[None]], limiter: RateLimiter, paths: tuple[str, ...] = ("/api/",)):
        self.app = app
        self.limiter = limiter
        self.paths = paths
        self.trusted = parse_networks(limiter.config.trusted_proxies)
        self._last_warning = -math.inf
        self._failures = 0

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.paths):
            await self.app(scope, receive, send)
            return

        headers = _headers(scope)
        api_key = headers.get("x-api-key", "").strip()
        if not api_key:
            await _json(send, 401, {"error": "missing API key"})
            return
        if len(api_key) > MAX_API_KEY_BYTES:  # latin-1 decoded: one character per byte
            await _json(send, 401, {"error": "API key too long"})
            return
        peer = scope["client"][0] if scope.get("client") else None
        ip = client_ip(peer, headers.get("x-forwarded-for"), self.trusted)

        try:
            decision = await self.limiter.check(api_key, ip)
        except Exception as exc:  # noqa: BLE001 -- any failure: connection, timeout, error reply, odd reply
            self._warn(exc)
            if self.limiter.config.failure_mode == "closed":
                await _json(send, 503, {"error": "rate limiter unavailable"}, [("Retry-After", "1")])
            else:
                await self.app(scope, receive, send)  # fail open: serve, without rate headers
            return

        rate_headers = decision.headers()
        if not decision.allowed:
            await _json(send, 429, {"error": "rate limited", "retry_after": decision.retry_after_s}, rate_headers)
            return

        encoded = [(k.lower().encode(), v.encode()) for k, v in rate_headers]

        async def send_with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *encoded]}
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def _warn(self, exc: Exception) -> None:
        # One line per 10 s at most: a down Valkey under load would otherwise
        # write a line per request.
        self._failures += 1
        now = time.monotonic()
        if now - self._last_warning >= 10:
            log.warning(
                "rate limiter unavailable (%d failure(s) since the last report), failing %s: %r",
                self._failures, self.limiter.config.failure_mode, exc,
            )
            self._last_warning = now
            self._failures = 0


def _headers(scope: dict) -> dict[str, str]:
    # X-Forwarded-For may arrive split over several lines: they are joined
    # with "," into one list, as HTTP allows. Of any other repeated header
    # (X-API-Key sent twice) the first value is used.
    out: dict[str, str] = {}
    for k, v in scope.get("headers", []):
        name, value = k.decode("latin-1").lower(), v.decode("latin-1")
        if name not in out:
            out[name] = value
        elif name == "x-forwarded-for":
            out[name] = f"{out[name]},{value}"
    return out


async def _json(send: Callable, status: int, body: dict, headers: list[tuple[str, str]] = ()) -> None:
    data = json.dumps(body, separators=(",", ":")).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in headers]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data})
