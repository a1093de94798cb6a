//! The recipe's HTTP behaviour against a real valkey-server with the module
//! (examples/README.md, section 3). `test.sh` starts the server and exports
//! RL_TEST_VALKEY_ADDR; each test has its own key prefix, so one server
//! serves the whole run. Requests go through the router in process
//! (`tower::ServiceExt::oneshot`, with the peer address as `ConnectInfo`);
//! the last test runs the demo binary over real TCP.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{HeaderMap, HeaderValue, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use ratelimit_axum::app;
use ratelimit_axum::rate_limit::{
    client_ip, set_headers, Decision, FailureMode, IpNet, Limiter, RateLimitConfig, RateLimiter,
};
use serde_json::{json, Value};
use tower::ServiceExt;

// ------------------------------------------------------------------ fixtures

/// The failure tests' timeout, and the bound on every answer while Valkey
/// fails: the whole call is cut at 2 * timeout; the margin is for the machine.
const FAILURE_TIMEOUT: Duration = Duration::from_millis(50);
const FAILURE_BOUND: Duration = Duration::from_millis(2 * 50 + 150);

fn valkey_addr() -> String {
    std::env::var("RL_TEST_VALKEY_ADDR")
        .expect("RL_TEST_VALKEY_ADDR is not set: run examples/rust/test.sh, which starts valkey-server with the module")
}

/// A fresh key prefix per test.
fn prefix() -> String {
    format!(
        "rl:test:{:016x}:api",
        RandomState::new().hash_one(Instant::now())
    )
}

/// EXISTS, from a plain connection: what the tests look at in Valkey.
fn exists(key: &str) -> bool {
    let mut c = redis::Client::open(format!("redis://{}", valkey_addr()))
        .unwrap()
        .get_connection()
        .unwrap();
    redis::cmd("EXISTS").arg(key).query::<i64>(&mut c).unwrap() == 1
}

/// The limits the tests start from: a slow refill (burst 5, 5 per 60 s: one
/// token per 12 s), so that no token comes back however loaded the machine.
/// The timeouts are generous here (a loaded machine must not turn a slow
/// answer into a failure); the failure tests use the real 50 ms.
fn config(prefix: &str) -> RateLimitConfig {
    RateLimitConfig {
        valkey_addr: valkey_addr(),
        prefix: prefix.to_owned(),
        key_burst: 5,
        key_rate: 5,
        key_period: 60,
        ip_limit: 20,
        ip_period: 60,
        timeout: Duration::from_secs(1),
        ..RateLimitConfig::default()
    }
}

/// The app, and the peer address its requests come from.
struct Client {
    app: Router,
    peer: SocketAddr,
}

fn client(config: RateLimitConfig) -> Client {
    client_from(config, "127.0.0.1")
}

fn client_from(config: RateLimitConfig, peer: &str) -> Client {
    Client {
        app: app(RateLimiter::new(config).unwrap()),
        peer: SocketAddr::new(peer.parse().unwrap(), 40000),
    }
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Value,
}

impl Answer {
    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .map(|v| v.to_str().unwrap())
            .unwrap_or_else(|| panic!("no {name} header"))
    }
    fn has(&self, name: &str) -> bool {
        self.headers.contains_key(name)
    }
}

impl Client {
    /// `GET path` with the given headers.
    async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Answer {
        let mut req = Request::get(path);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let mut req = req.body(Body::empty()).unwrap();
        req.extensions_mut().insert(ConnectInfo(self.peer));
        let res = self.app.clone().oneshot(req).await.unwrap();
        let (parts, body) = res.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        }
    }

    async fn hello(&self, api_key: &str) -> Answer {
        self.get("/api/hello", &[("x-api-key", api_key)]).await
    }
}

// ------------------------------------------------------------------ limits and headers

#[tokio::test]
async fn allows_exactly_the_burst() {
    let c = client(config(&prefix()));
    let mut statuses = Vec::new();
    for _ in 0..7 {
        statuses.push(c.hello("key-a").await.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429]);
}

#[tokio::test]
async fn headers_on_200() {
    let r = client(config(&prefix())).hello("key-a").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, json!({"message": "hello"}));
    // burst 5 at 5 per 60 s: the GCRA's window is the 60 s it takes to earn 5 back
    assert_eq!(
        r.header("ratelimit-policy"),
        r#""key";q=5;w=60, "ip";q=20;w=60"#
    );
    // the key (4 left) is more restrictive than the IP (19 left); one token takes 12 s
    assert_eq!(r.header("ratelimit"), r#""key";r=4;t=12"#);
    assert_eq!(r.header("x-ratelimit-limit"), "5");
    assert_eq!(r.header("x-ratelimit-remaining"), "4");
    assert_eq!(r.header("x-ratelimit-reset"), "12");
    assert!(!r.has("retry-after"));
}

#[tokio::test]
async fn headers_on_429() {
    let c = client(config(&prefix()));
    let start = Instant::now();
    for _ in 0..5 {
        assert_eq!(c.hello("key-a").await.status, StatusCode::OK);
    }
    let r = c.hello("key-a").await;
    // The server's clock moved at most this much (whole seconds, rounded up).
    let slack = start.elapsed().as_millis().div_ceil(1000) as i64;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("content-type"), "application/json");
    let retry: i64 = r.header("retry-after").parse().unwrap();
    assert!((12 - slack..=12).contains(&retry), "Retry-After {retry}"); // the next token: 12 s after the first request
    assert_eq!(
        r.body,
        json!({"error": "rate limited", "retry_after": retry})
    );
    assert_eq!(
        r.header("ratelimit-policy"),
        r#""key";q=5;w=60, "ip";q=20;w=60"#
    );
    let t: i64 = r
        .header("ratelimit")
        .strip_prefix(r#""key";r=0;t="#)
        .expect("key, 0 left")
        .parse()
        .unwrap();
    assert!((60 - slack..=60).contains(&t), "t={t}"); // all 5 back 60 s after the first
    assert_eq!(r.header("x-ratelimit-limit"), "5");
    assert_eq!(r.header("x-ratelimit-remaining"), "0");
    assert_eq!(r.header("x-ratelimit-reset"), t.to_string());
}

#[tokio::test]
async fn ip_limit_is_shared_across_keys() {
    let p = prefix();
    let c = client(RateLimitConfig {
        ip_limit: 3,
        ..config(&p)
    });
    for i in 0..3 {
        assert_eq!(c.hello(&format!("k{i}")).await.status, StatusCode::OK);
    }
    let r = c.hello("k3").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        r.header("ratelimit").starts_with(r#""ip";r=0;t="#),
        "{}",
        r.header("ratelimit")
    );
    assert_eq!(r.header("x-ratelimit-limit"), "3");
    assert_eq!(
        r.header("ratelimit-policy"),
        r#""key";q=5;w=60, "ip";q=3;w=60"#
    );
    // All or nothing: the IP denied it, so the key's limiter was not charged.
    assert!(!exists(&format!("{p}:key:k3")));
}

#[tokio::test]
async fn recovers_after_retry_after() {
    // One token every 500 ms.
    let c = client(RateLimitConfig {
        key_burst: 2,
        key_rate: 2,
        key_period: 1,
        ..config(&prefix())
    });
    // On a loaded machine a token may come back meanwhile: go on until denied.
    let mut r = c.hello("key-a").await;
    for _ in 0..20 {
        if r.status == StatusCode::TOO_MANY_REQUESTS {
            break;
        }
        r = c.hello("key-a").await;
    }
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = r.header("retry-after").parse().unwrap();
    assert_eq!(retry, 1); // 500 ms at most, rounded up
    tokio::time::sleep(Duration::from_secs(retry)).await;
    assert_eq!(c.hello("key-a").await.status, StatusCode::OK);
}

#[tokio::test]
async fn api_keys_are_limited_separately() {
    let c = client(config(&prefix()));
    for _ in 0..5 {
        assert_eq!(c.hello("key-a").await.status, StatusCode::OK);
    }
    assert_eq!(c.hello("key-a").await.status, StatusCode::TOO_MANY_REQUESTS);
    let r = c.hello("key-b").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("x-ratelimit-remaining"), "4");
}

#[tokio::test]
async fn api_key_longer_than_256_bytes_is_401() {
    let p = prefix();
    let c = client(config(&p));
    let long = "k".repeat(256);
    assert_eq!(c.hello(&long).await.status, StatusCode::OK);
    let r = c.hello(&format!("{long}k")).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(r.body, json!({"error": "API key too long"}));
    assert!(!r.has("ratelimit"));
    assert!(exists(&format!("{p}:key:{long}")));
    assert!(!exists(&format!("{p}:key:{long}k")));
}

#[tokio::test]
async fn repeated_api_key_header_uses_the_first() {
    let p = prefix();
    let c = client(config(&p));
    let r = c
        .get("/api/hello", &[("x-api-key", "k1"), ("x-api-key", "k2")])
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(exists(&format!("{p}:key:k1")));
    assert!(!exists(&format!("{p}:key:k1,k2")) && !exists(&format!("{p}:key:k1, k2")));
}

#[tokio::test]
async fn missing_api_key_is_401() {
    let c = client(config(&prefix()));
    for headers in [&[][..], &[("x-api-key", "")][..]] {
        let r = c.get("/api/hello", headers).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
        assert_eq!(r.body, json!({"error": "missing API key"}));
        assert!(!r.has("ratelimit"));
    }
}

// ------------------------------------------------------------------ client IP

#[tokio::test]
async fn forwarded_for_from_untrusted_peer_is_ignored() {
    let p = prefix();
    let c = client(RateLimitConfig {
        ip_limit: 2,
        ..config(&p)
    }); // no trusted proxies
    let mut last = None;
    for (i, forged) in ["198.51.100.1", "198.51.100.2", "198.51.100.3"]
        .iter()
        .enumerate()
    {
        let key = format!("k{i}");
        last = Some(
            c.get(
                "/api/hello",
                &[("x-api-key", &key), ("x-forwarded-for", forged)],
            )
            .await,
        );
    }
    assert_eq!(last.unwrap().status, StatusCode::TOO_MANY_REQUESTS); // the three share the peer's IP limit
    assert!(exists(&format!("{p}:ip:127.0.0.1")));
    assert!(!exists(&format!("{p}:ip:198.51.100.1")));
}

#[tokio::test]
async fn forwarded_for_from_trusted_peer_is_used() {
    let p = prefix();
    let trusted = IpNet::parse_list("10.0.0.0/8").unwrap();
    let c = client_from(
        RateLimitConfig {
            ip_limit: 2,
            trusted_proxies: trusted,
            ..config(&p)
        },
        "10.0.0.5",
    );
    // The client wrote the left entry itself; our proxy appended the address it saw.
    let chain = [
        ("x-api-key", "k1"),
        ("x-forwarded-for", "198.51.100.9, 203.0.113.7"),
    ];
    assert_eq!(c.get("/api/hello", &chain).await.status, StatusCode::OK);
    assert_eq!(c.get("/api/hello", &chain).await.status, StatusCode::OK);
    assert_eq!(
        c.get("/api/hello", &chain).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let other = [("x-api-key", "k1"), ("x-forwarded-for", "203.0.113.8")];
    assert_eq!(c.get("/api/hello", &other).await.status, StatusCode::OK);
    assert!(exists(&format!("{p}:ip:203.0.113.7")));
    assert!(!exists(&format!("{p}:ip:198.51.100.9")));
    assert!(!exists(&format!("{p}:ip:10.0.0.5")));
}

#[test]
fn client_ip_rules() {
    let trusted = IpNet::parse_list("10.0.0.0/8, ::1").unwrap();
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let xff = |v: &str| {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", v.parse().unwrap());
        h
    };
    let none = HeaderMap::new();
    let got = |peer: &str, h: &HeaderMap| client_ip(ip(peer), h, &trusted).to_string();
    assert_eq!(got("192.0.2.1", &xff("203.0.113.7")), "192.0.2.1"); // untrusted peer
    assert_eq!(got("10.1.1.1", &none), "10.1.1.1"); // trusted, no header
    assert_eq!(
        got("10.1.1.1", &xff("203.0.113.7, 10.2.2.2")),
        "203.0.113.7"
    ); // skips our proxies
    assert_eq!(got("10.1.1.1", &xff("10.3.3.3, 10.2.2.2")), "10.3.3.3"); // all trusted: leftmost
    assert_eq!(got("10.1.1.1", &xff("203.0.113.7, junk")), "10.1.1.1"); // garbage stops the walk
    assert_eq!(got("::ffff:192.0.2.1", &none), "192.0.2.1"); // IPv4-mapped
    assert_eq!(got("::1", &xff("2001:DB8:0:0::1")), "2001:db8::1"); // canonical IPv6
                                                                    // Several X-Forwarded-For lines form one list.
    let mut two = xff("198.51.100.9");
    two.append("x-forwarded-for", "203.0.113.7, 10.2.2.2".parse().unwrap());
    assert_eq!(got("10.1.1.1", &two), "203.0.113.7");
    // CIDR edges.
    let net = IpNet::parse("192.0.2.128/25").unwrap();
    assert!(
        net.contains(ip("192.0.2.128"))
            && net.contains(ip("192.0.2.255"))
            && net.contains(ip("::ffff:192.0.2.200"))
    );
    assert!(!net.contains(ip("192.0.2.127")) && !net.contains(ip("2001:db8::1")));
    assert!(IpNet::parse("0.0.0.0/0")
        .unwrap()
        .contains(ip("198.51.100.1")));
    assert!(IpNet::parse("10.0.0.0/33").is_err() && IpNet::parse("nope").is_err());
}

#[test]
fn bad_config_is_refused() {
    let zero_rate = RateLimitConfig {
        key_rate: 0,
        ..RateLimitConfig::default()
    };
    assert_eq!(
        RateLimiter::new(zero_rate).err().unwrap(),
        "key_rate must be at least 1"
    );
}

#[test]
fn empty_environment_variables_are_unset() {
    let d = RateLimitConfig::default();
    for blank in ["", "  "] {
        let c = RateLimitConfig::from_vars(|_| Some(blank.to_owned())).unwrap();
        assert_eq!(
            (
                c.valkey_addr,
                c.prefix,
                c.key_burst,
                c.key_rate,
                c.key_period
            ),
            (
                d.valkey_addr.clone(),
                d.prefix.clone(),
                d.key_burst,
                d.key_rate,
                d.key_period
            )
        );
        assert_eq!(
            (
                c.ip_limit,
                c.ip_period,
                c.trusted_proxies,
                c.failure_mode,
                c.timeout
            ),
            (
                d.ip_limit,
                d.ip_period,
                d.trusted_proxies.clone(),
                d.failure_mode,
                d.timeout
            )
        );
    }
    let c = RateLimitConfig::from_vars(|n| (n == "RL_KEY_BURST").then(|| " 7 ".into())).unwrap();
    assert_eq!(c.key_burst, 7);
}

// ------------------------------------------------------------------ header values of made-up replies (no server)

const POLICY: &str = r#""key";q=5;w=60, "ip";q=20;w=60"#;

fn limiter(
    name: &'static str,
    allowed: bool,
    limit: i64,
    remaining: i64,
    retry: i64,
    reset: i64,
) -> Limiter {
    Limiter {
        name,
        allowed,
        limit,
        remaining,
        retry_after_ms: retry,
        reset_after_ms: reset,
    }
}

/// A 429 decided by the key's limiter (0 left), the IP's with room.
fn denied(retry_after_ms: i64, reset_after_ms: i64) -> Decision {
    Decision {
        allowed: false,
        retry_after_ms,
        limiters: vec![
            limiter("key", false, 5, 0, retry_after_ms, reset_after_ms),
            limiter("ip", true, 20, 10, 0, 30_000),
        ],
    }
}

fn headers_of(d: &Decision) -> HeaderMap {
    let mut h = HeaderMap::new();
    set_headers(&mut h, &HeaderValue::from_static(POLICY), d);
    h
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).map(|v| v.to_str().unwrap())
}

#[test]
fn retry_after_is_rounded_up() {
    for (ms, want) in [
        (1, "1"),
        (999, "1"),
        (1000, "1"),
        (1001, "2"),
        (11950, "12"),
    ] {
        assert_eq!(
            header(&headers_of(&denied(ms, 60_000)), "retry-after"),
            Some(want),
            "{ms} ms"
        );
        // The 429 body's retry_after.
        assert_eq!(
            denied(ms, 60_000)
                .retry_after_s()
                .map(|s| s.to_string())
                .as_deref(),
            Some(want)
        );
    }
}

#[test]
fn reset_is_rounded_up() {
    for (ms, want) in [(0, "0"), (1, "1"), (1000, "1"), (59001, "60")] {
        let h = headers_of(&denied(1000, ms));
        assert_eq!(
            header(&h, "ratelimit"),
            Some(format!(r#""key";r=0;t={want}"#).as_str()),
            "{ms} ms"
        );
        assert_eq!(header(&h, "x-ratelimit-reset"), Some(want), "{ms} ms");
    }
}

#[test]
fn headers_of_a_decision() {
    let ok = Decision {
        allowed: true,
        retry_after_ms: 0,
        limiters: vec![
            limiter("key", true, 5, 3, 0, 24_000),
            limiter("ip", true, 20, 3, 0, 59_001),
        ],
    };
    let h = headers_of(&ok);
    // A tie on remaining and wait: the longer reset, the IP's, is reported.
    assert_eq!(header(&h, "ratelimit-policy"), Some(POLICY));
    assert_eq!(header(&h, "ratelimit"), Some(r#""ip";r=3;t=60"#));
    assert_eq!(header(&h, "x-ratelimit-limit"), Some("20"));
    assert_eq!(header(&h, "x-ratelimit-remaining"), Some("3"));
    assert_eq!(header(&h, "x-ratelimit-reset"), Some("60"));
    assert_eq!(header(&h, "retry-after"), None);
    let never = Decision {
        allowed: false,
        retry_after_ms: -1,
        limiters: vec![
            limiter("key", false, 5, 0, 5000, 60_000),
            limiter("ip", false, 20, 0, -1, 0),
        ],
    };
    let h = headers_of(&never);
    assert_eq!(header(&h, "ratelimit"), Some(r#""ip";r=0;t=0"#)); // -1 (never) is the longest wait
    assert_eq!(header(&h, "retry-after"), None);
}

// ------------------------------------------------------------------ failure policy

/// A TCP proxy in front of the real Valkey, to play one that stalls. New
/// connections are forwarded to the real server (`forward`) or accepted and
/// never answered; `blackhole` makes every connection open so far stop
/// forwarding, both ways, without closing it: a Valkey gone behind a dead
/// route, or a connection a failover left behind.
struct Proxy {
    addr: String,
    forward: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<(Vec<TcpStream>, Arc<AtomicBool>)>>>,
}

impl Proxy {
    fn new() -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = Proxy {
            addr: listener.local_addr().unwrap().to_string(),
            forward: Arc::default(),
            conns: Arc::default(),
        };
        let (forward, conns, target) = (p.forward.clone(), p.conns.clone(), valkey_addr());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let live = Arc::new(AtomicBool::new(true));
                let mut socks = vec![client.try_clone().unwrap()];
                if forward.load(Ordering::SeqCst) {
                    let upstream = TcpStream::connect(&target).unwrap();
                    socks.push(upstream.try_clone().unwrap());
                    Self::pump(
                        client.try_clone().unwrap(),
                        upstream.try_clone().unwrap(),
                        &live,
                    );
                    Self::pump(upstream, client, &live);
                }
                conns.lock().unwrap().push((socks, live));
            }
        });
        p
    }

    fn pump(mut src: TcpStream, mut dst: TcpStream, live: &Arc<AtomicBool>) {
        let live = live.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 65536];
            while let Ok(n @ 1..) = src.read(&mut buf) {
                if live.load(Ordering::SeqCst) {
                    let _ = dst.write_all(&buf[..n]); // else swallowed: black-holed
                }
            }
        });
    }

    fn blackhole(&self) {
        for (_, live) in self.conns.lock().unwrap().iter() {
            live.store(false, Ordering::SeqCst);
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        for (socks, _) in self.conns.lock().unwrap().iter() {
            for s in socks {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}

impl Client {
    /// GET /api/hello, which must be answered within FAILURE_BOUND.
    async fn timed_hello(&self) -> Answer {
        let start = Instant::now();
        let r = self.hello("key-a").await;
        let took = start.elapsed();
        assert!(
            took < FAILURE_BOUND,
            "answered in {took:?}, bound {FAILURE_BOUND:?}"
        );
        r
    }

    async fn until_decided(&self) {
        let deadline = Instant::now() + Duration::from_secs(3);
        while !self.timed_hello().await.has("ratelimit") {
            assert!(
                Instant::now() < deadline,
                "no decision 3 s after Valkey came back"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A Valkey that accepts and never answers, then answers (a new connection
/// reaches it); then the connection in use goes dead without being closed.
/// Each time, after a failure within the bound, a later request is decided.
#[tokio::test]
async fn stalled_connection_is_replaced() {
    let proxy = Proxy::new();
    let c = client(RateLimitConfig {
        valkey_addr: proxy.addr.clone(),
        timeout: FAILURE_TIMEOUT,
        ..config(&prefix())
    }); // fails open
    let r = c.timed_hello().await;
    assert!(r.status == StatusCode::OK && !r.has("ratelimit"));
    proxy.forward.store(true, Ordering::SeqCst);
    c.until_decided().await;
    proxy.blackhole();
    let r = c.timed_hello().await;
    assert!(r.status == StatusCode::OK && !r.has("ratelimit"));
    c.until_decided().await;
}

/// A loopback port nothing listens on.
fn dead_addr() -> (String, Option<TcpListener>) {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    (format!("127.0.0.1:{port}"), None)
}

/// A port that accepts connections (the kernel completes the handshake) and
/// never answers: a Valkey that hangs. The listener lives as long as the test.
fn hung_addr() -> (String, Option<TcpListener>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    (l.local_addr().unwrap().to_string(), Some(l))
}

#[tokio::test]
async fn failure_policy() {
    for (target, make) in [("dead", dead_addr as fn() -> _), ("hung", hung_addr)] {
        for mode in [FailureMode::Open, FailureMode::Closed] {
            let (addr, _listener) = make();
            let c = client(RateLimitConfig {
                valkey_addr: addr,
                failure_mode: mode,
                timeout: FAILURE_TIMEOUT,
                ..config(&prefix())
            });
            // The second request shows that a failed connection is not left hanging.
            for attempt in 1..=2 {
                let start = Instant::now();
                let r = c.hello("key-a").await;
                let took = start.elapsed();
                let what = format!("{target} {mode:?} #{attempt}");
                assert!(
                    took < FAILURE_BOUND,
                    "{what}: answered in {took:?}, bound {FAILURE_BOUND:?}"
                );
                assert!(
                    !r.has("ratelimit") && !r.has("x-ratelimit-remaining"),
                    "{what}"
                );
                match mode {
                    FailureMode::Open => {
                        assert_eq!(r.status, StatusCode::OK, "{what}");
                        assert_eq!(r.body, json!({"message": "hello"}));
                    }
                    FailureMode::Closed => {
                        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{what}");
                        assert_eq!(r.header("retry-after"), "1");
                        assert_eq!(r.body, json!({"error": "rate limiter unavailable"}));
                    }
                }
            }
        }
    }
}

// ------------------------------------------------------------------ the demo binary

/// The demo server as deployed: its own process, configured from the
/// environment, over real HTTP (so the peer address is the socket's).
#[test]
fn demo_binary_from_environment() {
    let p = prefix();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(env!("CARGO_BIN_EXE_ratelimit-axum"))
        .envs([
            ("VALKEY_ADDR", valkey_addr()),
            ("RL_PREFIX", p.clone()),
            ("RL_KEY_BURST", "3".into()),
            ("RL_KEY_RATE", "3".into()),
            ("RL_KEY_PERIOD", "60".into()),
            ("PORT", port.to_string()),
        ])
        .spawn()
        .unwrap();
    struct Kill(Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Kill(child);

    let deadline = Instant::now() + Duration::from_secs(30);
    while http_get(port, "/healthz", "").is_none() {
        assert!(
            child.0.try_wait().unwrap().is_none(),
            "the demo server exited"
        );
        assert!(
            Instant::now() < deadline,
            "the demo server did not start within 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let r = http_get(port, "/api/hello", "X-API-Key: key-a\r\n").unwrap();
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(r.contains("\r\nratelimit: \"key\";r=2;t=20\r\n"), "{r}");
    assert!(
        r.contains("\r\nratelimit-policy: \"key\";q=3;w=60, \"ip\";q=20;w=60\r\n"),
        "{r}"
    );
    assert!(exists(&format!("{p}:ip:127.0.0.1"))); // the real peer address
    let health = http_get(port, "/healthz", "").unwrap();
    assert!(
        health.starts_with("HTTP/1.1 200") && !health.contains("ratelimit"),
        "{health}"
    ); // not limited
}

/// A bare HTTP/1.1 GET: the whole answer (header names as hyper writes them:
/// lower case), or None when nothing answers.
fn http_get(port: u16, path: &str, headers: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: test\r\n{headers}Connection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    Some(answer)
}
