//! Rate limiting for axum with the valkey-ratelimit module's `RL.ALL`.
//!
//! Copy this file into your service. It needs `axum` 0.8, `redis` 1.x (feature
//! `tokio-comp`), `serde_json` and `tokio` (features `sync`, `time`):
//!
//! ```ignore
//! let limiter = RateLimiter::new(RateLimitConfig::from_env()?)?;
//! let app = Router::new()
//!     .route("/api/hello", get(hello))
//!     .route_layer(middleware::from_fn_with_state(limiter, rate_limit));
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! ```
//!
//! Every request through the middleware is charged to two limiters in one
//! atomic call: its API key (a GCRA: bursts of `key_burst`, `key_rate` per
//! `key_period`) and its client IP (a sliding window: `ip_limit` per
//! `ip_period`). The contract (headers, status codes, failure policy) is
//! examples/README.md's, the same in every recipe.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::{
    extract::{ConnectInfo, Request, State},
    http::{HeaderMap, HeaderName, HeaderValue, StatusCode},
    middleware::Next,
    response::{IntoResponse, Response},
    Json,
};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ErrorKind, RedisError};
use serde_json::json;

/// Longer API keys are refused (`401`) before any Valkey call, so that one
/// request cannot create a huge key.
pub const MAX_API_KEY_BYTES: usize = 256;

// ------------------------------------------------------------------ config

/// What to do when Valkey cannot decide (down, slow, an error reply).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureMode {
    /// Serve the request, without rate-limit headers, and log a warning: an
    /// outage of the limiter does not become an outage of the API.
    Open,
    /// `503` with `Retry-After: 1`: for endpoints where unlimited traffic is
    /// worse than none (logins, payments, expensive operations).
    Closed,
}

/// The knobs, with the defaults every recipe shares.
#[derive(Clone, Debug)]
pub struct RateLimitConfig {
    /// `host:port` of Valkey.
    pub valkey_addr: String,
    /// Key prefix: bump the version (`rl:v2:api`) to start from fresh limiters.
    pub prefix: String,
    /// Per API key, GCRA: `key_burst` at once, `key_rate` per `key_period` seconds.
    pub key_burst: u64,
    pub key_rate: u64,
    pub key_period: u64,
    /// Per client IP, sliding window: `ip_limit` per `ip_period` seconds.
    pub ip_limit: u64,
    pub ip_period: u64,
    /// Peers (IPs or CIDRs) whose `X-Forwarded-For` is believed: your proxies.
    pub trusted_proxies: Vec<IpNet>,
    pub failure_mode: FailureMode,
    /// Connect timeout and command timeout; a whole call is cut at `2 * timeout`.
    pub timeout: Duration,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        RateLimitConfig {
            valkey_addr: "127.0.0.1:6379".into(),
            prefix: "rl:v1:api".into(),
            key_burst: 5,
            key_rate: 5,
            key_period: 1,
            ip_limit: 20,
            ip_period: 60,
            trusted_proxies: Vec::new(),
            failure_mode: FailureMode::Open,
            timeout: Duration::from_millis(50),
        }
    }
}

impl RateLimitConfig {
    /// The same knobs from `VALKEY_ADDR`, `RL_PREFIX`, `RL_KEY_BURST`,
    /// `RL_KEY_RATE`, `RL_KEY_PERIOD`, `RL_IP_LIMIT`, `RL_IP_PERIOD`,
    /// `RL_TRUSTED_PROXIES` (comma-separated IPs/CIDRs), `RL_FAILURE_MODE`
    /// (`open`/`closed`) and `RL_TIMEOUT_MS`; unset, empty or blank ones keep
    /// their default.
    pub fn from_env() -> Result<Self, String> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// [`from_env`](Self::from_env) with the variables from `var`.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let env = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        fn num(name: &str, value: Option<String>, default: u64) -> Result<u64, String> {
            match value {
                None => Ok(default),
                Some(v) => match v.trim().parse() {
                    Ok(n) if n >= 1 => Ok(n),
                    _ => Err(format!(
                        "{name} must be an integer of at least 1, not {v:?}"
                    )),
                },
            }
        }
        let d = RateLimitConfig::default();
        Ok(RateLimitConfig {
            valkey_addr: env("VALKEY_ADDR").map_or(d.valkey_addr, |v| v.trim().to_owned()),
            prefix: env("RL_PREFIX").map_or(d.prefix, |v| v.trim().to_owned()),
            key_burst: num("RL_KEY_BURST", env("RL_KEY_BURST"), d.key_burst)?,
            key_rate: num("RL_KEY_RATE", env("RL_KEY_RATE"), d.key_rate)?,
            key_period: num("RL_KEY_PERIOD", env("RL_KEY_PERIOD"), d.key_period)?,
            ip_limit: num("RL_IP_LIMIT", env("RL_IP_LIMIT"), d.ip_limit)?,
            ip_period: num("RL_IP_PERIOD", env("RL_IP_PERIOD"), d.ip_period)?,
            trusted_proxies: match env("RL_TRUSTED_PROXIES") {
                Some(list) => IpNet::parse_list(&list)?,
                None => Vec::new(),
            },
            failure_mode: match env("RL_FAILURE_MODE").as_deref().map(str::trim) {
                None | Some("open") => FailureMode::Open,
                Some("closed") => FailureMode::Closed,
                Some(other) => {
                    return Err(format!(
                        "RL_FAILURE_MODE must be open or closed, not {other:?}"
                    ))
                }
            },
            timeout: Duration::from_millis(num("RL_TIMEOUT_MS", env("RL_TIMEOUT_MS"), 50)?),
        })
    }

    /// Every count and period at least 1, and a timeout.
    pub fn validate(&self) -> Result<(), String> {
        let counts = [
            ("key_burst", self.key_burst),
            ("key_rate", self.key_rate),
            ("key_period", self.key_period),
            ("ip_limit", self.ip_limit),
            ("ip_period", self.ip_period),
        ];
        if let Some((name, _)) = counts.iter().find(|(_, v)| *v < 1) {
            return Err(format!("{name} must be at least 1"));
        }
        if self.timeout.is_zero() {
            return Err("timeout must not be zero".into());
        }
        Ok(())
    }

    /// `RateLimit-Policy`: for the GCRA `q` is the burst and `w` the time to
    /// earn a whole burst back, `ceil(burst * period / rate)` seconds; for the
    /// sliding window the limit and its period.
    pub fn policy_header(&self) -> String {
        let key_window = (self.key_burst * self.key_period).div_ceil(self.key_rate);
        format!(
            "\"key\";q={};w={}, \"ip\";q={};w={}",
            self.key_burst, key_window, self.ip_limit, self.ip_period
        )
    }
}

/// An IP network from the trusted-proxy list: `10.0.0.0/8`, `::1`, `192.0.2.7`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    prefix_len: u8,
}

impl IpNet {
    pub fn parse(s: &str) -> Result<IpNet, String> {
        let bad = || format!("not an IP address or CIDR: {s:?}");
        let (ip, len) = match s.trim().split_once('/') {
            Some((ip, len)) => (ip, Some(len.parse::<u8>().map_err(|_| bad())?)),
            None => (s.trim(), None),
        };
        let addr = ip.parse::<IpAddr>().map_err(|_| bad())?.to_canonical();
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix_len = len.unwrap_or(max);
        if prefix_len > max {
            return Err(bad());
        }
        Ok(IpNet { addr, prefix_len })
    }

    pub fn parse_list(list: &str) -> Result<Vec<IpNet>, String> {
        list.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(IpNet::parse)
            .collect()
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let n = u32::from(self.prefix_len);
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                n == 0 || (u32::from(net) ^ u32::from(ip)) >> (32 - n) == 0
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                n == 0 || (u128::from(net) ^ u128::from(ip)) >> (128 - n) == 0
            }
            _ => false,
        }
    }
}

// ------------------------------------------------------------------ client IP

/// The address to limit: the peer's, unless the peer is a trusted proxy.
///
/// Anyone can send `X-Forwarded-For`, so it is read only when the direct peer
/// is one of our proxies, and then from the right: each proxy appends the
/// address it saw, so the rightmost entries are our proxies' and the first
/// address that is not one of them is the client. What stands left of it was
/// written by the client itself and proves nothing. A malformed entry stops
/// the walk at the last hop we could vouch for; when every entry is a trusted
/// proxy, the leftmost is used.
pub fn client_ip(peer: IpAddr, headers: &HeaderMap, trusted: &[IpNet]) -> IpAddr {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|net| net.contains(ip));
    let mut ip = peer.to_canonical(); // ::ffff:192.0.2.1 is 192.0.2.1
    if !is_trusted(ip) {
        return ip;
    }
    // A header may arrive split over several lines: they form one list.
    let entries: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .collect();
    for entry in entries.iter().rev() {
        match entry.trim().parse::<IpAddr>() {
            Err(_) => break,
            Ok(hop) => {
                ip = hop.to_canonical();
                if !is_trusted(ip) {
                    break;
                }
            }
        }
    }
    ip
}

// ------------------------------------------------------------------ the decision

/// One limiter's five fields from the RL.ALL reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limiter {
    /// `key` or `ip`: the item's name in the `RateLimit` header.
    pub name: &'static str,
    pub allowed: bool,
    pub limit: i64,
    pub remaining: i64,
    pub retry_after_ms: i64,
    pub reset_after_ms: i64,
}

/// The decision of one RL.ALL call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// The call's wait: the longest of the limiters' (0 when allowed; -1 never).
    pub retry_after_ms: i64,
    /// The API key's limiter, then the IP's.
    pub limiters: Vec<Limiter>,
}

impl Decision {
    /// The most restrictive limiter, which `RateLimit` and `X-RateLimit-*`
    /// describe: the least remaining, then the longest wait (-1, "never",
    /// counts as the longest), then the longest reset, then the first.
    pub fn binding(&self) -> &Limiter {
        let wait = |ms: i64| if ms < 0 { i64::MAX } else { ms };
        // min_by_key keeps the first of equal elements: `key` wins a full tie.
        self.limiters
            .iter()
            .min_by_key(|l| (l.remaining, -wait(l.retry_after_ms), -l.reset_after_ms))
            .expect("RL.ALL replies one item per limiter")
    }

    /// `Retry-After` in whole seconds, rounded up, at least 1; `None` when the
    /// request can never pass (`retry_after_ms = -1`).
    pub fn retry_after_s(&self) -> Option<i64> {
        (self.retry_after_ms >= 0).then(|| ceil_seconds(self.retry_after_ms).max(1))
    }
}

/// Milliseconds to whole seconds, rounded up: a client that waits that long
/// is never early.
pub fn ceil_seconds(ms: i64) -> i64 {
    (ms.max(0) as u64).div_ceil(1000) as i64
}

/// Why no decision could be made; every one of them is a failure.
#[derive(Debug)]
pub enum LimiterError {
    /// No answer within the deadline.
    Timeout,
    /// Connection refused or lost, or an error reply (`ERR unknown command`
    /// when the module is not loaded, `OOM`, `NOPERM`, ...).
    Valkey(redis::RedisError),
    /// A reply of an unexpected shape.
    Reply(String),
}

impl std::fmt::Display for LimiterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LimiterError::Timeout => f.write_str("no answer from Valkey in time"),
            LimiterError::Valkey(e) => write!(f, "{e}"),
            LimiterError::Reply(e) => write!(f, "unexpected RL.ALL reply: {e}"),
        }
    }
}

// ------------------------------------------------------------------ the limiter

/// The Valkey side. Cheap to clone: all clones share one multiplexed
/// connection, opened by the first request and dropped after a timeout or a
/// lost connection, so that the next request opens a new one.
#[derive(Clone)]
pub struct RateLimiter {
    config: Arc<RateLimitConfig>,
    policy: HeaderValue,
    valkey: Arc<Valkey>,
    warnings: Arc<Mutex<Warnings>>,
}

/// The shared connection. (redis-rs's `ConnectionManager` is not used: it
/// keeps a connection on which a command timed out, and one that stopped
/// answering would then fail every request.)
struct Valkey {
    client: redis::Client,
    options: AsyncConnectionConfig,
    slot: Mutex<Slot>,
    /// One connection attempt at a time; the others wait for it.
    connecting: tokio::sync::Mutex<()>,
}

struct Slot {
    generation: u64,
    conn: Option<MultiplexedConnection>,
}

impl Valkey {
    fn current(&self) -> Option<(u64, MultiplexedConnection)> {
        let slot = self.slot.lock().unwrap();
        slot.conn.clone().map(|c| (slot.generation, c))
    }

    /// The shared connection, opened if there is none.
    async fn connection(&self) -> Result<(u64, MultiplexedConnection), RedisError> {
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let _gate = self.connecting.lock().await;
        if let Some(c) = self.current() {
            return Ok(c); // opened while we waited
        }
        let conn = self
            .client
            .get_multiplexed_async_connection_with_config(&self.options)
            .await?;
        let mut slot = self.slot.lock().unwrap();
        slot.generation += 1;
        slot.conn = Some(conn.clone());
        Ok((slot.generation, conn))
    }

    /// Drops the connection `generation` (unless it was already replaced).
    fn discard(&self, generation: u64) {
        let mut slot = self.slot.lock().unwrap();
        if slot.generation == generation {
            slot.conn = None;
        }
    }
}

/// An error after which the connection still works: a reply came (an error
/// reply, or one of an unexpected shape). Any other (a timeout, a lost
/// connection) drops it.
fn connection_is_fine(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Server(_) | ErrorKind::Extension | ErrorKind::UnexpectedReturnType
    )
}

struct Warnings {
    last: Option<Instant>,
    failures: u64,
}

impl RateLimiter {
    /// Does not wait for Valkey: the service starts (and applies its failure
    /// policy) while Valkey is down.
    pub fn new(config: RateLimitConfig) -> Result<RateLimiter, String> {
        config.validate()?;
        let client = redis::Client::open(format!("redis://{}", config.valkey_addr))
            .map_err(|e| format!("VALKEY_ADDR {:?}: {e}", config.valkey_addr))?;
        // A client that gives up quickly: a limiter must never be the slow
        // part of a request. No retries (a retry would double what a down
        // Valkey costs); a request that finds the connection broken fails now
        // and the next one connects anew. Commands are never queued for later.
        let options = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(config.timeout))
            .set_response_timeout(Some(config.timeout));
        Ok(RateLimiter {
            policy: HeaderValue::try_from(config.policy_header()).expect("ASCII"),
            config: Arc::new(config),
            valkey: Arc::new(Valkey {
                client,
                options,
                slot: Mutex::new(Slot {
                    generation: 0,
                    conn: None,
                }),
                connecting: tokio::sync::Mutex::new(()),
            }),
            warnings: Arc::new(Mutex::new(Warnings {
                last: None,
                failures: 0,
            })),
        })
    }

    pub fn config(&self) -> &RateLimitConfig {
        &self.config
    }

    /// Charges one request by `api_key` from `ip` to both limiters, atomically.
    pub async fn check(&self, api_key: &str, ip: IpAddr) -> Result<Decision, LimiterError> {
        let c = &*self.config;
        // RL.ALL decides both limiters at once: a request denied by one
        // consumes from neither. In Valkey Cluster all keys of one RL.ALL must
        // hash to one slot (else CROSSSLOT), and these two do not. There, put
        // one hash tag in both keys (`{prefix}:{key:<apikey>}` and
        // `{prefix}:{key:<apikey>}:ip:<ip>`, which limits per key and IP: a
        // different policy), or make two calls (RL.GCRA, then RL.WINDOW) and
        // lose the all-or-nothing. In standalone Valkey any keys work.
        let mut cmd = redis::cmd("RL.ALL");
        cmd.arg(2)
            .arg(format!("{}:key:{}", c.prefix, api_key))
            .arg(format!("{}:ip:{}", c.prefix, ip))
            .arg("GCRA")
            .arg(c.key_burst)
            .arg(c.key_rate)
            .arg(format!("{}s", c.key_period))
            .arg("WINDOW")
            .arg(c.ip_limit)
            .arg(format!("{}s", c.ip_period))
            .arg("SLIDING");

        // The client's timeouts bound each step; this deadline bounds the
        // whole call (connecting, then the command) whatever happens inside.
        let deadline = tokio::time::Instant::now() + 2 * c.timeout;
        let (generation, mut conn) = tokio::time::timeout_at(deadline, self.valkey.connection())
            .await
            .map_err(|_| LimiterError::Timeout)?
            .map_err(LimiterError::Valkey)?;
        let reply: (i64, i64, Vec<Vec<i64>>) =
            match tokio::time::timeout_at(deadline, cmd.query_async(&mut conn)).await {
                Ok(Ok(reply)) => reply,
                Ok(Err(e)) => {
                    if !connection_is_fine(&e) {
                        self.valkey.discard(generation);
                    }
                    return Err(LimiterError::Valkey(e));
                }
                Err(_) => {
                    // It may never answer again (a server gone behind a
                    // dead route): the next request connects anew.
                    self.valkey.discard(generation);
                    return Err(LimiterError::Timeout);
                }
            };
        parse_reply(reply)
    }

    /// One warning per 10 s at most: a down Valkey under load would
    /// otherwise log a line per request. (Use `tracing::warn!` in a service
    /// that has a subscriber.)
    fn warn(&self, error: &LimiterError) {
        let mut w = self.warnings.lock().unwrap();
        w.failures += 1;
        if w.last
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(10))
        {
            let mode = match self.config.failure_mode {
                FailureMode::Open => "open",
                FailureMode::Closed => "closed",
            };
            eprintln!(
                "rate limiter unavailable ({} failure(s) since the last report), failing {mode}: {error}",
                w.failures
            );
            w.last = Some(Instant::now());
            w.failures = 0;
        }
    }
}

/// RESP2: `[allowed, retry_after_ms, [[allowed, limit, remaining,
/// retry_after_ms, reset_after_ms], [..the same for the ip limiter..]]]`.
fn parse_reply(
    (allowed, retry_after_ms, items): (i64, i64, Vec<Vec<i64>>),
) -> Result<Decision, LimiterError> {
    if items.len() != 2 {
        return Err(LimiterError::Reply(format!(
            "{} limiters, expected 2",
            items.len()
        )));
    }
    let limiters = ["key", "ip"]
        .into_iter()
        .zip(items)
        .map(|(name, fields)| match fields[..] {
            [allowed, limit, remaining, retry_after_ms, reset_after_ms] => Ok(Limiter {
                name,
                allowed: allowed == 1,
                limit,
                remaining,
                retry_after_ms,
                reset_after_ms,
            }),
            _ => Err(LimiterError::Reply(format!(
                "{name}: {} fields, expected 5",
                fields.len()
            ))),
        })
        .collect::<Result<_, _>>()?;
    Ok(Decision {
        allowed: allowed == 1,
        retry_after_ms,
        limiters,
    })
}

// ------------------------------------------------------------------ the middleware

/// The client IP the limiter used, for the handlers behind the middleware.
#[derive(Clone, Copy, Debug)]
pub struct ClientIp(pub IpAddr);

/// The middleware: `middleware::from_fn_with_state(limiter, rate_limit)`.
/// It reads the peer address from `ConnectInfo<SocketAddr>`: serve the router
/// with `into_make_service_with_connect_info::<SocketAddr>()`.
pub async fn rate_limit(
    State(limiter): State<RateLimiter>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    mut request: Request,
    next: Next,
) -> Response {
    // Who: the API key (a production service would rather hash it, or use the
    // account it authenticates to) and the client IP. Of a repeated
    // X-API-Key, the first (`HeaderMap::get`).
    let api_key = match request
        .headers()
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
    {
        Some(k) if k.len() > MAX_API_KEY_BYTES => {
            return json_response(
                StatusCode::UNAUTHORIZED,
                json!({"error": "API key too long"}),
            )
        }
        Some(k) if !k.is_empty() => k.to_owned(),
        _ => {
            return json_response(
                StatusCode::UNAUTHORIZED,
                json!({"error": "missing API key"}),
            )
        }
    };
    let ip = client_ip(
        peer.ip(),
        request.headers(),
        &limiter.config().trusted_proxies,
    );
    request.extensions_mut().insert(ClientIp(ip));

    let decision = match limiter.check(&api_key, ip).await {
        Ok(decision) => decision,
        Err(error) => {
            limiter.warn(&error);
            return match limiter.config().failure_mode {
                FailureMode::Open => next.run(request).await, // serve, without rate headers
                FailureMode::Closed => {
                    let mut r = json_response(
                        StatusCode::SERVICE_UNAVAILABLE,
                        json!({"error": "rate limiter unavailable"}),
                    );
                    r.headers_mut()
                        .insert("retry-after", HeaderValue::from_static("1"));
                    r
                }
            };
        }
    };

    let mut response = if decision.allowed {
        next.run(request).await
    } else {
        json_response(
            StatusCode::TOO_MANY_REQUESTS,
            json!({"error": "rate limited", "retry_after": decision.retry_after_s()}),
        )
    };
    set_headers(response.headers_mut(), &limiter.policy, &decision);
    response
}

/// The rate-limit headers of a decision (draft-ietf-httpapi-ratelimit-headers,
/// -07 and later, plus the older `X-RateLimit-*`), on 200 and 429 alike, and
/// `Retry-After` on a 429. `policy` is [`RateLimitConfig::policy_header`].
pub fn set_headers(h: &mut HeaderMap, policy: &HeaderValue, decision: &Decision) {
    let b = decision.binding();
    let reset = ceil_seconds(b.reset_after_ms);
    let value = |s: String| HeaderValue::try_from(s).expect("ASCII");
    h.insert(HeaderName::from_static("ratelimit-policy"), policy.clone());
    h.insert(
        HeaderName::from_static("ratelimit"),
        value(format!("\"{}\";r={};t={reset}", b.name, b.remaining)),
    );
    h.insert(
        HeaderName::from_static("x-ratelimit-limit"),
        HeaderValue::from(b.limit),
    );
    h.insert(
        HeaderName::from_static("x-ratelimit-remaining"),
        HeaderValue::from(b.remaining),
    );
    h.insert(
        HeaderName::from_static("x-ratelimit-reset"),
        HeaderValue::from(reset),
    );
    if let Some(s) = decision.retry_after_s().filter(|_| !decision.allowed) {
        h.insert(HeaderName::from_static("retry-after"), HeaderValue::from(s));
    }
}

fn json_response(status: StatusCode, body: serde_json::Value) -> Response {
    (status, Json(body)).into_response()
}
