"""Rate limiting for ASGI apps (FastAPI, Starlette) with valkey-ratelimit's RL.ALL.

Copy this file into your service. It depends on the `valkey-ratelimit`
package (clients/python: the RL.ALL call, its result and its headers) and
`valkey` (valkey-py);
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

import ipaddress
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from collections.abc import Awaitable, Callable, Iterable

import valkey.asyncio as valkey
from valkey.asyncio.retry import Retry
from valkey.backoff import NoBackoff
from valkey_ratelimit import AllResult as Decision
from valkey_ratelimit import AsyncRateLimiter, Gcra, Window

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
        protocol=2,
    )


class RateLimiter:
    """Decides one request: both limiters in one RL.ALL call, through the valkey-ratelimit package."""

    def __init__(self, client: valkey.Valkey, config: RateLimitConfig) -> None:
        self.config = config
        c = config
        # The client's own timeouts bound each step; this bounds the whole
        # call (connect, handshake, command): at most 2 * timeout_ms. Failures
        # raise (on_unavailable="raise"): the middleware applies the policy.
        self.limiter = AsyncRateLimiter(client, timeout=2 * c.timeout_ms / 1000)
        self.key_limit = Gcra(c.key_burst, c.key_rate, f"{c.key_period}s")
        self.ip_limit = Window(c.ip_limit, f"{c.ip_period}s", sliding=True)

    async def check(self, api_key: str, client_ip: str) -> Decision:
        """Charge one request; raises on any failure (the caller applies the failure policy)."""
        p = self.config.prefix
        # RL.ALL decides both limiters atomically: a request denied by one
        # consumes from neither. In Valkey Cluster all keys of one RL.ALL must
        # hash to one slot (else CROSSSLOT): these two do not. There, build
        # both with valkey_ratelimit.same_slot(f"key:{api_key}", "key",
        # f"ip:{client_ip}") (which limits per key and IP), or make two calls
        # and lose the all-or-nothing. In standalone Valkey any keys work.
        return await self.limiter.all(
            [(f"{p}:key:{api_key}", self.key_limit), (f"{p}:ip:{client_ip}", self.ip_limit)],
            names=("key", "ip"),
        )


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

        # One RateLimit item, the binding limiter's: the contract of examples/README.md.
        rate_headers = list(decision.headers(binding_only=True).items())
        if not decision.allowed:
            body = {"error": "rate limited", "retry_after": decision.retry_after_seconds}
            await _json(send, 429, body, rate_headers)
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
