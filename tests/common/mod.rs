//! Test harness: a real `valkey-server` with the module loaded, one per test,
//! on its own loopback port and in its own temporary directory.
//!
//! Environment:
//! - `VALKEY_SERVER`: the server binary (default `/usr/bin/valkey-server`).
//! - `RL_MODULE`: the module (default `<crate>/target/release/libvalkey_ratelimit.so`).
//! - `RL_TEST_SERVER`: `[host:]port` of a running server with the module
//!   loaded (a container, a packaged install): tests then run against it, one
//!   at a time, each after a `FLUSHALL`, a reset of the module's policies and
//!   configs and the removal of ACL users other than `default`, as
//!   valkey-bundle runs a module's tests. A test that needs a server of its
//!   own (other arguments, a restart, a replica, the log) stops at once with
//!   [`NEEDS_OWN_SERVER`] in its message; scripts/test-external.sh counts those
//!   as skipped. See docs/testing.md.
//!
//! Every helper panics with context on an unexpected reply, so a test reads as
//! a list of expectations. Commands are given as `argv![...]` (anything
//! `Display`), errors come back as the server's text (`"ERR ..."`).

#![allow(dead_code)]

use redis::{Connection, ConnectionLike, Value};
use std::cell::Cell;
use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Builds an argv (`Vec<String>`) from anything `Display`.
#[macro_export]
macro_rules! argv {
    ($($x:expr),* $(,)?) => {
        ::std::vec::Vec::<String>::from([$($x.to_string()),*])
    };
}

/// How long a server gets to answer PING after it was started.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Read timeout of every connection: a hung server fails the test instead of hanging it.
pub const IO_TIMEOUT: Duration = Duration::from_secs(60);

pub const ONE_HOUR_MS: i64 = 3_600_000;
pub const MAX_COUNT: u64 = 1_000_000_000_000_000;

pub fn server_binary() -> String {
    std::env::var("VALKEY_SERVER").unwrap_or_else(|_| "/usr/bin/valkey-server".to_string())
}

pub fn module_path() -> PathBuf {
    match std::env::var_os("RL_MODULE") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/target/release/libvalkey_ratelimit.so"
        )),
    }
}

/// In a test's panic message: it needs a server of its own, so it cannot run
/// against `RL_TEST_SERVER` (scripts/test-external.sh counts it as skipped).
pub const NEEDS_OWN_SERVER: &str = "RL_TEST_SERVER: this test needs a server of its own";

/// `RL_TEST_SERVER` as (host, port).
pub fn external_server() -> Option<(String, u16)> {
    let text = std::env::var("RL_TEST_SERVER")
        .ok()
        .filter(|t| !t.is_empty())?;
    let (host, port) = match text.rsplit_once(':') {
        Some((host, port)) => (host.to_string(), port),
        None => ("127.0.0.1".to_string(), text.as_str()),
    };
    let port = port
        .parse()
        .unwrap_or_else(|_| panic!("RL_TEST_SERVER must be [host:]port, not {text:?}"));
    Some((host, port))
}

/// Stops a test that cannot run against `RL_TEST_SERVER`.
pub fn needs_own_server(why: &str) {
    if external_server().is_some() {
        panic!("{NEEDS_OWN_SERVER} ({why})");
    }
}

/// One test at a time on the external server.
static EXTERNAL: Mutex<()> = Mutex::new(());
thread_local! {
    static HOLDS_EXTERNAL: Cell<bool> = const { Cell::new(false) };
}

/// The module's configs at their defaults, as a fresh server has them.
const CONFIG_DEFAULTS: &[(&str, &str)] = &[
    ("ratelimit.max-limiters", "16"),
    ("ratelimit.events", "no"),
    ("ratelimit.shadow-mode", "no"),
    ("ratelimit.always-propagate", "no"),
];

/// A directory under the system temp dir, removed on drop.
pub struct TempDir {
    pub path: PathBuf,
}

impl TempDir {
    pub fn new(prefix: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = std::env::temp_dir().join(format!(
            "{prefix}-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        ));
        fs::create_dir_all(&path).expect("create temp dir");
        TempDir { path }
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

/// The last `lines` lines of a file, for failure messages.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_else(|e| format!("<cannot read {path:?}: {e}>"));
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// How to stop the server in [`Server::restart`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shutdown {
    /// `SHUTDOWN SAVE`: an RDB snapshot is written first.
    Save,
    /// `SHUTDOWN NOSAVE`: no snapshot (the AOF, when on, is still flushed).
    NoSave,
}

enum StartError {
    /// Another process holds the port: try another one.
    PortTaken(String),
    Failed(String),
}

pub struct Server {
    pub port: u16,
    host: String,
    /// Held while a test uses the `RL_TEST_SERVER` server (None: ours).
    external: Option<MutexGuard<'static, ()>>,
    /// Arguments placed before the module's `--loadmodule` (another module
    /// that must load first, say).
    first: Vec<String>,
    extra: Vec<String>,
    child: Option<Child>,
    log: PathBuf,
    // Dropped last: the child is killed before its directory goes.
    dir: TempDir,
}

impl Server {
    /// A server with the module and the default arguments: the
    /// `RL_TEST_SERVER` one when that is set.
    pub fn start() -> Server {
        match external_server() {
            Some((host, port)) => Server::external(host, port),
            None => Server::start_with(&[]),
        }
    }

    /// The running server at host:port, emptied and reset for this test.
    fn external(host: String, port: u16) -> Server {
        if HOLDS_EXTERNAL.with(Cell::get) {
            panic!("{NEEDS_OWN_SERVER} (a second server)");
        }
        let guard = EXTERNAL
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        HOLDS_EXTERNAL.with(|h| h.set(true));
        let server = Server {
            port,
            host,
            external: Some(guard),
            first: Vec::new(),
            extra: Vec::new(),
            child: None,
            log: PathBuf::new(),
            dir: TempDir {
                path: PathBuf::new(),
            },
        };
        let mut con = server.conn();
        q(&mut con, &argv!["FLUSHALL"]);
        for name in array(&q(&mut con, &argv!["RL.POLICY.LIST"])).to_vec() {
            q(&mut con, &argv!["RL.POLICY.DEL", string(&name)]);
        }
        for user in array(&q(&mut con, &argv!["ACL", "USERS"])).to_vec() {
            let user = string(&user);
            if user != "default" {
                q(&mut con, &argv!["ACL", "DELUSER", user]);
            }
        }
        for (name, value) in CONFIG_DEFAULTS {
            q(&mut con, &argv!["CONFIG", "SET", name, value]);
        }
        let now = counters(&string(&q(&mut con, &argv!["INFO", "ratelimit"])));
        *COUNTERS_AT_START.lock().unwrap_or_else(|p| p.into_inner()) = now;
        server
    }

    /// A server with extra command-line arguments (they come last, so they
    /// override the defaults, e.g. `["--appendonly", "yes"]`).
    pub fn start_with(extra: &[&str]) -> Server {
        Server::start_with_first(&[], extra)
    }

    /// As [`Server::start_with`], with `first` before the module's
    /// `--loadmodule` (e.g. `["--loadmodule", "/path/libredis_cell.so"]`).
    pub fn start_with_first(first: &[&str], extra: &[&str]) -> Server {
        needs_own_server("a server with other arguments");
        let module = module_path();
        assert!(
            module.exists(),
            "module not found at {module:?}: build it with `cargo build --release` or set RL_MODULE"
        );
        let mut dir = TempDir::new("valkey-rl-test");
        let log = dir.path.join("server.log");
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let mut last_error = String::new();
        for _ in 0..8 {
            let port = free_port();
            let mut server = Server {
                port,
                host: "127.0.0.1".to_string(),
                external: None,
                first: first.iter().map(|s| s.to_string()).collect(),
                extra: extra.clone(),
                child: None,
                log: log.clone(),
                dir,
            };
            match server.launch() {
                Ok(()) => return server,
                Err(StartError::PortTaken(why)) => {
                    last_error = why;
                    server.kill();
                    dir = std::mem::replace(
                        &mut server.dir,
                        TempDir {
                            path: PathBuf::new(),
                        },
                    );
                }
                Err(StartError::Failed(why)) => panic!("{why}"),
            }
        }
        panic!("could not start valkey-server on a free port: {last_error}");
    }

    pub fn dir(&self) -> &Path {
        needs_own_server("the server's directory");
        &self.dir.path
    }

    pub fn log_tail(&self, lines: usize) -> String {
        if self.external.is_some() {
            return "(RL_TEST_SERVER: its log is not ours to read)".to_string();
        }
        tail(&self.log, lines)
    }

    pub fn url(&self) -> String {
        format!("redis://{}:{}/", self.host, self.port)
    }

    fn args(&self) -> Vec<String> {
        let mut args = self.first.clone();
        args.extend(argv![
            "--port",
            self.port,
            "--bind",
            "127.0.0.1",
            "--dir",
            self.dir.path.display(),
            "--save",
            "",
            "--appendonly",
            "no",
            "--enable-debug-command",
            "yes",
            "--loadmodule",
            module_path().display()
        ]);
        args.extend(self.extra.iter().cloned());
        args
    }

    fn launch(&mut self) -> Result<(), StartError> {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open server log");
        let child = Command::new(server_binary())
            .args(self.args())
            .current_dir(&self.dir.path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", server_binary()));
        let pid = child.id();
        self.child = Some(child);
        self.wait_ready(pid)
    }

    fn wait_ready(&mut self, pid: u32) -> Result<(), StartError> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                let log = self.log_tail(40);
                self.child = None;
                if log.contains("Address already in use") {
                    return Err(StartError::PortTaken(log));
                }
                return Err(StartError::Failed(format!(
                    "valkey-server exited at start ({status}); args {:?}; log tail:\n{log}",
                    self.args()
                )));
            }
            if let Ok(mut con) = self.try_conn(&self.url()) {
                if let Ok(Value::SimpleString(pong)) = con.req_command(&redis::cmd("PING")) {
                    if pong == "PONG" {
                        let info = info(&mut con, "server");
                        let server_pid = field(&info, "process_id").unwrap_or_default();
                        if server_pid != pid.to_string() {
                            // Someone else answers on our port.
                            return Err(StartError::PortTaken(format!(
                                "port {} answered by pid {server_pid}, ours is {pid}",
                                self.port
                            )));
                        }
                        return Ok(());
                    }
                }
            }
            if Instant::now() > deadline {
                return Err(StartError::Failed(format!(
                    "valkey-server did not answer PING within {START_TIMEOUT:?}; log tail:\n{}",
                    self.log_tail(40)
                )));
            }
            sleep(Duration::from_millis(20));
        }
    }

    fn try_conn(&self, url: &str) -> redis::RedisResult<Connection> {
        let client = redis::Client::open(url)?;
        let con = client.get_connection_with_timeout(Duration::from_secs(2))?;
        con.set_read_timeout(Some(IO_TIMEOUT))?;
        con.set_write_timeout(Some(IO_TIMEOUT))?;
        Ok(con)
    }

    /// A RESP2 connection.
    pub fn conn(&self) -> Connection {
        self.try_conn(&self.url())
            .unwrap_or_else(|e| panic!("connect to {}: {e}\n{}", self.url(), self.log_tail(20)))
    }

    /// A RESP3 connection (the client sends `HELLO 3`).
    pub fn conn_resp3(&self) -> Connection {
        let url = format!("redis://{}:{}/?protocol=resp3", self.host, self.port);
        self.try_conn(&url)
            .unwrap_or_else(|e| panic!("connect to {url}: {e}\n{}", self.log_tail(20)))
    }

    /// A connection authenticated as `user` (any password works for `nopass` users).
    pub fn conn_as(&self, user: &str, password: &str) -> Connection {
        let url = format!("redis://{user}:{password}@{}:{}/", self.host, self.port);
        self.try_conn(&url)
            .unwrap_or_else(|e| panic!("connect as {user}: {e}\n{}", self.log_tail(20)))
    }

    /// Stops the server (SHUTDOWN SAVE or NOSAVE) and starts it again with the
    /// same port, directory and arguments, so RDB and AOF files are loaded.
    pub fn restart(&mut self, how: Shutdown) {
        self.restart_with(how, None);
    }

    /// As [`Server::restart`], replacing the extra arguments when `extra` is given.
    pub fn restart_with(&mut self, how: Shutdown, extra: Option<&[&str]>) {
        self.stop(how);
        if let Some(extra) = extra {
            self.extra = extra.iter().map(|s| s.to_string()).collect();
        }
        match self.launch() {
            Ok(()) => {}
            Err(StartError::PortTaken(why)) | Err(StartError::Failed(why)) => {
                panic!("restart failed: {why}")
            }
        }
    }

    /// Shuts the server down and waits for the process to exit.
    pub fn stop(&mut self, how: Shutdown) {
        needs_own_server("a restart or shutdown");
        let word = match how {
            Shutdown::Save => "SAVE",
            Shutdown::NoSave => "NOSAVE",
        };
        if let Ok(mut con) = self.try_conn(&self.url()) {
            // The reply is the connection closing; an error reply means it refused.
            if let Ok(Value::ServerError(e)) = con.req_command(redis::cmd("SHUTDOWN").arg(word)) {
                panic!("SHUTDOWN {word} refused: {e:?}\n{}", self.log_tail(20));
            }
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        if let Some(child) = self.child.as_mut() {
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => sleep(Duration::from_millis(10)),
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        panic!("server did not shut down in 30 s\n{}", tail(&self.log, 20));
                    }
                }
            }
        }
        self.child = None;
    }

    /// Whether the process is still running.
    pub fn is_alive(&mut self) -> bool {
        if self.external.is_some() {
            return self
                .try_conn(&self.url())
                .is_ok_and(|mut con| con.req_command(&redis::cmd("PING")).is_ok());
        }
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Asserts the server process is alive and answers PING.
    pub fn assert_alive(&mut self) {
        assert!(
            self.is_alive(),
            "server process died; log tail:\n{}",
            self.log_tail(60)
        );
        let mut con = self.conn();
        let pong = q(&mut con, &argv!["PING"]);
        assert_eq!(pong, Value::SimpleString("PONG".into()));
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.external.take().is_some() {
            HOLDS_EXTERNAL.with(|h| h.set(false));
            return;
        }
        if std::thread::panicking() {
            eprintln!(
                "---- valkey-server (port {}) log tail ----\n{}\n----",
                self.port,
                self.log_tail(30)
            );
        }
        self.kill();
    }
}

// ---------------------------------------------------------------------------
// Replication

/// Extra arguments for a primary whose `master_repl_offset` is compared
/// before/after a command: no periodic PINGs to replicas move it.
pub const QUIET_PRIMARY: &[&str] = &["--repl-ping-replica-period", "3600"];

/// Starts a replica of `primary`, waits for the link to be up and for the
/// replica to have caught up.
pub fn start_replica(primary: &Server) -> Server {
    needs_own_server("a replica");
    let port = primary.port.to_string();
    let replica =
        Server::start_with(&["--replicaof", "127.0.0.1", &port, "--repl-timeout", "3600"]);
    let mut con = replica.conn();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = info(&mut con, "replication");
        if field(&text, "master_link_status").as_deref() == Some("up") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "replica link not up in 30 s:\n{text}\nreplica log:\n{}\nprimary log:\n{}",
            replica.log_tail(30),
            primary.log_tail(30)
        );
        sleep(Duration::from_millis(20));
    }
    sync_replica(primary, &replica);
    replica
}

/// A primary (with [`QUIET_PRIMARY`] and `extra`) and a synced replica.
pub fn primary_and_replica(extra: &[&str]) -> (Server, Server) {
    let mut args: Vec<&str> = QUIET_PRIMARY.to_vec();
    args.extend_from_slice(extra);
    let primary = Server::start_with(&args);
    let replica = start_replica(&primary);
    (primary, replica)
}

/// `WAIT 1 5000` on the primary (skipped when `primary` is itself a replica,
/// in a chain), then waits until the replica's offset reaches the primary's.
pub fn sync_replica(primary: &Server, replica: &Server) {
    let mut pcon = primary.conn();
    let mut rcon = replica.conn();
    if field(&info(&mut pcon, "replication"), "role").as_deref() == Some("master") {
        let acked: i64 = int(&q(&mut pcon, &argv!["WAIT", 1, 5000]));
        assert_eq!(acked, 1, "WAIT 1 5000: the replica did not acknowledge");
    }
    let target = repl_offset(&mut pcon);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let at = repl_offset(&mut rcon);
        if at >= target {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "replica offset {at} did not reach primary offset {target}"
        );
        sleep(Duration::from_millis(10));
    }
}

// ---------------------------------------------------------------------------
// Commands and replies

pub fn to_cmd(argv: &[String]) -> redis::Cmd {
    guard_external(argv);
    let mut cmd = redis::cmd(&argv[0]);
    for arg in &argv[1..] {
        cmd.arg(arg.as_str());
    }
    cmd
}

/// The raw reply, errors included as `Value::ServerError` (nested ones too).
pub fn raw(con: &mut Connection, argv: &[String]) -> Value {
    raw_cmd(con, &to_cmd(argv))
}

pub fn raw_cmd(con: &mut Connection, cmd: &redis::Cmd) -> Value {
    con.req_command(cmd).unwrap_or_else(|e| {
        panic!(
            "I/O error on {:?}: {e}",
            String::from_utf8_lossy(&cmd.get_packed_command())
        )
    })
}

/// An error reply as the server wrote it: `"ERR something"`, `"WRONGTYPE ..."`.
/// `None` when `v` is not an error.
pub fn error_of(v: &Value) -> Option<String> {
    match v {
        Value::ServerError(e) => Some(match e.details() {
            Some(detail) => format!("{} {detail}", e.code()),
            None => e.code().to_string(),
        }),
        _ => None,
    }
}

/// The reply, or the error text.
pub fn try_q(con: &mut Connection, argv: &[String]) -> Result<Value, String> {
    let v = raw(con, argv);
    match error_of(&v) {
        Some(e) => Err(e),
        None => Ok(v),
    }
}

/// The reply; panics on an error reply.
pub fn q(con: &mut Connection, argv: &[String]) -> Value {
    try_q(con, argv).unwrap_or_else(|e| {
        skip_without_debug(&e);
        panic!("{argv:?} failed: {e}")
    })
}

/// On the `RL_TEST_SERVER` server, a test may change the module's configs
/// (reset before each test) but not the server's, nor its role.
fn guard_external(argv: &[String]) {
    if argv.is_empty() || external_server().is_none() {
        return;
    }
    let word = |i: usize| {
        argv.get(i)
            .map(|w| w.to_ascii_lowercase())
            .unwrap_or_default()
    };
    if word(0) == "config" && word(1) == "set" && !word(2).starts_with("ratelimit.") {
        needs_own_server(&format!("CONFIG SET {}", word(2)));
    }
    if ["replicaof", "slaveof", "failover", "shutdown"].contains(&word(0).as_str()) {
        needs_own_server(&word(0));
    }
}

/// A test that needs DEBUG, on an external server that refuses it.
fn skip_without_debug(error: &str) {
    if error.contains("DEBUG command not allowed") {
        needs_own_server("DEBUG is off on this server: enable-debug-command local");
    }
}

/// The error text; panics when the command succeeds.
pub fn q_err(con: &mut Connection, argv: &[String]) -> String {
    match try_q(con, argv) {
        Err(e) => e,
        Ok(v) => panic!("{argv:?} should fail but replied {v:?}"),
    }
}

pub fn int(v: &Value) -> i64 {
    match v {
        Value::Int(n) => *n,
        Value::BulkString(b) => String::from_utf8_lossy(b)
            .parse()
            .unwrap_or_else(|_| panic!("not an integer: {v:?}")),
        Value::SimpleString(s) => s
            .parse()
            .unwrap_or_else(|_| panic!("not an integer: {v:?}")),
        _ => panic!("not an integer: {v:?}"),
    }
}

pub fn string(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::VerbatimString { text, .. } => text.clone(),
        Value::Okay => "OK".to_string(),
        Value::Int(n) => n.to_string(),
        _ => panic!("not a string: {v:?}"),
    }
}

pub fn array(v: &Value) -> &[Value] {
    match v {
        Value::Array(items) | Value::Set(items) => items,
        _ => panic!("not an array: {v:?}"),
    }
}

/// The five-field reply of every RL command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    pub allowed: bool,
    pub limit: i64,
    pub remaining: i64,
    pub retry_after: i64,
    pub reset_after: i64,
}

pub const FIELDS: [&str; 5] = [
    "allowed",
    "limit",
    "remaining",
    "retry_after_ms",
    "reset_after_ms",
];

impl Reply {
    /// Parses a RESP2 array `[allowed, limit, remaining, retry_after_ms,
    /// reset_after_ms]` or a RESP3 map with those names; checks the invariants
    /// every reply has.
    pub fn parse(v: &Value) -> Reply {
        let numbers: Vec<i64> = match v {
            Value::Array(items) => {
                assert_eq!(items.len(), 5, "reply must have 5 elements: {v:?}");
                items
                    .iter()
                    .map(|item| match item {
                        Value::Int(n) => *n,
                        _ => panic!("reply element is not an integer: {v:?}"),
                    })
                    .collect()
            }
            Value::Map(pairs) => {
                assert_eq!(pairs.len(), 5, "reply map must have 5 entries: {v:?}");
                FIELDS
                    .iter()
                    .map(|name| {
                        let (_, value) = pairs
                            .iter()
                            .find(|(k, _)| string(k) == *name)
                            .unwrap_or_else(|| panic!("reply map lacks {name}: {v:?}"));
                        match value {
                            Value::Int(n) => *n,
                            _ => panic!("{name} is not an integer: {v:?}"),
                        }
                    })
                    .collect()
            }
            _ => panic!("not a rate-limit reply: {v:?}"),
        };
        assert!(
            numbers[0] == 0 || numbers[0] == 1,
            "allowed must be 0 or 1: {v:?}"
        );
        let reply = Reply {
            allowed: numbers[0] == 1,
            limit: numbers[1],
            remaining: numbers[2],
            retry_after: numbers[3],
            reset_after: numbers[4],
        };
        assert!(reply.limit >= 1, "limit >= 1: {reply:?}");
        assert!(
            (0..=reply.limit).contains(&reply.remaining),
            "0 <= remaining <= limit: {reply:?}"
        );
        assert!(reply.reset_after >= 0, "reset_after_ms >= 0: {reply:?}");
        if reply.allowed {
            assert_eq!(
                reply.retry_after, 0,
                "allowed => retry_after_ms 0: {reply:?}"
            );
        } else {
            assert!(
                reply.retry_after == -1 || reply.retry_after > 0,
                "denied => retry_after_ms -1 or > 0: {reply:?}"
            );
        }
        reply
    }
}

/// A small seeded generator (xorshift64) for reproducible random traffic.
pub fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

/// Runs an RL command and parses its reply; panics on an error.
pub fn rl(con: &mut Connection, argv: &[String]) -> Reply {
    Reply::parse(&q(con, argv))
}

/// Runs `cmds` in one MULTI/EXEC; returns EXEC's items (errors as `Value::ServerError`).
pub fn exec(con: &mut Connection, cmds: &[Vec<String>]) -> Vec<Value> {
    q(con, &argv!["MULTI"]);
    for cmd in cmds {
        match raw(con, cmd) {
            Value::SimpleString(s) if s == "QUEUED" => {}
            other => {
                let _ = raw(con, &argv!["DISCARD"]);
                skip_without_debug(&format!("{other:?}"));
                panic!("{cmd:?} was not queued: {other:?}");
            }
        }
    }
    match raw(con, &argv!["EXEC"]) {
        Value::Array(items) => {
            assert_eq!(items.len(), cmds.len(), "EXEC reply length");
            items
        }
        other => panic!("EXEC failed: {other:?}"),
    }
}

/// Runs `cmds` in one MULTI/EXEC preceded by TIME: returns the server's
/// cached time in ms (the time every command of the transaction sees) and the
/// replies.
pub fn timed(con: &mut Connection, cmds: &[Vec<String>]) -> (i64, Vec<Value>) {
    let mut all = vec![argv!["TIME"]];
    all.extend(cmds.iter().cloned());
    let mut items = exec(con, &all);
    let time = time_ms(&items.remove(0));
    (time, items)
}

/// One RL command at a known server time.
pub fn timed_rl(con: &mut Connection, cmd: &[String]) -> (i64, Reply) {
    let (t, items) = timed(con, &[cmd.to_vec()]);
    if let Some(e) = error_of(&items[0]) {
        panic!("{cmd:?} failed: {e}");
    }
    (t, Reply::parse(&items[0]))
}

fn time_ms(v: &Value) -> i64 {
    let parts = array(v);
    int(&parts[0]) * 1000 + int(&parts[1]) / 1000
}

/// The server's clock, in ms since the epoch.
pub fn server_time_ms(con: &mut Connection) -> i64 {
    time_ms(&q(con, &argv!["TIME"]))
}

/// Sleeps until the server's clock reads at least `target` ms.
pub fn sleep_until_server_ms(con: &mut Connection, target: i64) {
    loop {
        let now = server_time_ms(con);
        if now >= target {
            return;
        }
        sleep(Duration::from_millis((target - now) as u64));
    }
}

/// When fewer than `margin_ms` are left before the next multiple of
/// `period_ms`, waits until just past it: a test using windows of that period
/// then does not straddle a window boundary (for margins well above its run time).
pub fn avoid_boundary(con: &mut Connection, period_ms: i64, margin_ms: i64) {
    let now = server_time_ms(con);
    let left = period_ms - now.rem_euclid(period_ms);
    if left < margin_ms {
        sleep_until_server_ms(con, now + left + 5);
    }
}

// ---------------------------------------------------------------------------
// INFO and key state

pub fn info(con: &mut Connection, section: &str) -> String {
    let text = string(&q(con, &argv!["INFO", section]));
    if external_server().is_some() && section.starts_with("ratelimit") {
        return since_test_start(&text);
    }
    text
}

/// The module's counters when the test began on the `RL_TEST_SERVER` server,
/// which has counted other tests' calls before: a test sees its own.
static COUNTERS_AT_START: Mutex<Vec<(String, i64)>> = Mutex::new(Vec::new());
/// Gauges: what they are now, not a count.
const GAUGES: &[&str] = &[
    "ratelimit_blocked_clients",
    "ratelimit_propagating",
    "ratelimit_ver",
];

fn counters(text: &str) -> Vec<(String, i64)> {
    text.lines()
        .filter_map(|line| {
            let (name, value) = line.trim_end().split_once(':')?;
            let counter = name.starts_with("ratelimit_") && !GAUGES.contains(&name);
            Some((name.to_string(), value.parse().ok().filter(|_| counter)?))
        })
        .collect()
}

fn since_test_start(text: &str) -> String {
    let start = COUNTERS_AT_START.lock().unwrap_or_else(|p| p.into_inner());
    let adjust = |line: &str| -> Option<String> {
        let (name, value) = line.split_once(':')?;
        let (_, base) = start.iter().find(|(n, _)| n == name)?;
        Some(format!(
            "{name}:{}",
            value.trim_end().parse::<i64>().ok()? - base
        ))
    };
    text.lines()
        .map(|line| adjust(line).unwrap_or_else(|| line.to_string()))
        .collect::<Vec<_>>()
        .join("\r\n")
}

/// `name:value` from INFO text.
pub fn field(info: &str, name: &str) -> Option<String> {
    info.lines().find_map(|line| {
        let (k, v) = line.trim_end().split_once(':')?;
        (k == name).then(|| v.to_string())
    })
}

/// INFO `ratelimit_<name>` (section `ratelimit_stats`).
pub fn rl_stat(con: &mut Connection, name: &str) -> i64 {
    let text = info(con, "ratelimit");
    field(&text, &format!("ratelimit_{name}"))
        .unwrap_or_else(|| panic!("no ratelimit_{name} in:\n{text}"))
        .parse()
        .expect("INFO counter")
}

/// Clients waiting in the module now (BLOCK).
pub fn waiting(con: &mut Connection) -> i64 {
    rl_stat(con, "blocked_clients")
}

/// Waits until exactly `n` clients wait in the module (30 s at most).
pub fn until_waiting(con: &mut Connection, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while waiting(con) != n {
        assert!(Instant::now() < deadline, "never {n} waiting clients");
        sleep(Duration::from_millis(2));
    }
}

/// How many RL.APPLY the server ran (its `cmdstat_rl.apply` calls).
pub fn applied_calls(con: &mut Connection) -> i64 {
    let text = info(con, "commandstats");
    field(&text, "cmdstat_rl.apply").map_or(0, |v| {
        v.split(',')
            .next()
            .and_then(|c| c.strip_prefix("calls="))
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("cmdstat_rl.apply:{v}"))
    })
}

pub fn repl_offset(con: &mut Connection) -> i64 {
    let text = info(con, "replication");
    field(&text, "master_repl_offset")
        .unwrap_or_else(|| panic!("no master_repl_offset in:\n{text}"))
        .parse()
        .expect("master_repl_offset")
}

/// `DEBUG DIGEST-VALUE key` (forty zeros when the key is absent).
pub fn digest(con: &mut Connection, key: &str) -> String {
    let v = q(con, &argv!["DEBUG", "DIGEST-VALUE", key]);
    string(&array(&v)[0])
}

pub fn exists(con: &mut Connection, key: &str) -> bool {
    int(&q(con, &argv!["EXISTS", key])) == 1
}

pub fn pexpiretime(con: &mut Connection, key: &str) -> i64 {
    int(&q(con, &argv!["PEXPIRETIME", key]))
}

pub fn pttl(con: &mut Connection, key: &str) -> i64 {
    int(&q(con, &argv!["PTTL", key]))
}

pub fn dump(con: &mut Connection, key: &str) -> Option<Vec<u8>> {
    match q(con, &argv!["DUMP", key]) {
        Value::Nil => None,
        Value::BulkString(b) => Some(b),
        v => panic!("DUMP replied {v:?}"),
    }
}

/// (DEBUG DIGEST-VALUE, PEXPIRETIME) of each key: what must be equal on a
/// replica, after a reload or a restore.
pub fn digests_and_expiries(con: &mut Connection, keys: &[String]) -> Vec<(String, i64)> {
    keys.iter()
        .map(|k| (digest(con, k), pexpiretime(con, k)))
        .collect()
}

/// Everything observable about a key, to check it is untouched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyState {
    pub exists: bool,
    pub kind: String,
    pub digest: String,
    pub expire_at: i64,
    pub dump: Option<Vec<u8>>,
}

pub fn key_state(con: &mut Connection, key: &str) -> KeyState {
    KeyState {
        exists: exists(con, key),
        kind: string(&q(con, &argv!["TYPE", key])),
        digest: digest(con, key),
        expire_at: pexpiretime(con, key),
        dump: dump(con, key),
    }
}

// ---------------------------------------------------------------------------
// Algorithms

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algo {
    TokenBucket,
    FixedWindow,
    SlidingWindow,
    SlidingLog,
    Gcra,
}

impl Algo {
    pub const ALL: [Algo; 5] = [
        Algo::TokenBucket,
        Algo::FixedWindow,
        Algo::SlidingWindow,
        Algo::SlidingLog,
        Algo::Gcra,
    ];

    /// The command for `limit` per `period`. The token bucket and GCRA hold
    /// `limit` and refill ONE request per `period`, so within a test they do
    /// not refill when the period is long.
    pub fn cmd(self, key: &str, limit: u64, period: &str) -> Vec<String> {
        match self {
            Algo::TokenBucket => argv!["RL.TOKENBUCKET", key, limit, 1, period],
            Algo::FixedWindow => argv!["RL.WINDOW", key, limit, period],
            Algo::SlidingWindow => argv!["RL.WINDOW", key, limit, period, "SLIDING"],
            Algo::SlidingLog => argv!["RL.SLIDINGLOG", key, limit, period],
            Algo::Gcra => argv!["RL.GCRA", key, limit, 1, period],
        }
    }

    /// As [`Algo::cmd`], with options appended.
    pub fn cmd_with(self, key: &str, limit: u64, period: &str, options: &[&str]) -> Vec<String> {
        let mut cmd = self.cmd(key, limit, period);
        cmd.extend(options.iter().map(|s| s.to_string()));
        cmd
    }

    pub fn name(self) -> &'static str {
        match self {
            Algo::TokenBucket => "token bucket",
            Algo::FixedWindow => "fixed window",
            Algo::SlidingWindow => "sliding window",
            Algo::SlidingLog => "sliding log",
            Algo::Gcra => "GCRA",
        }
    }

    /// Whether the limiter's state depends on window alignment (then tests
    /// with long periods keep clear of a window edge).
    pub fn windowed(self) -> bool {
        matches!(self, Algo::FixedWindow | Algo::SlidingWindow)
    }
}

/// CRC-64/Jones as used by DUMP payloads (reflected, poly 0xad93d23594c935a9,
/// init 0, no final xor).
pub fn crc64(data: &[u8]) -> u64 {
    const POLY_REFLECTED: u64 = 0x95ac_9329_ac4b_c9b5;
    let mut crc: u64 = 0;
    for &byte in data {
        crc ^= u64::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ POLY_REFLECTED
            } else {
                crc >> 1
            };
        }
    }
    crc
}

/// Replaces a DUMP payload's trailing CRC with the right one for its body.
pub fn fix_dump_crc(payload: &mut [u8]) {
    let body = payload.len() - 8;
    let crc = crc64(&payload[..body]);
    payload[body..].copy_from_slice(&crc.to_le_bytes());
}

/// The module's own bytes inside a DUMP payload made with
/// `rdbcompression no` (src/core/codec.rs): (where they start, their length).
/// Layout: the module type opcode, the 64-bit module id, the string opcode,
/// the string's length, the string; then the EOF opcode, the RDB version
/// (2 bytes) and the CRC (8 bytes).
pub fn codec_span(payload: &[u8]) -> (usize, usize) {
    assert_eq!(payload[0], 7, "not a module value");
    assert_eq!(payload[1], 0x81, "module id not 64-bit");
    assert_eq!(payload[10], 5, "no string opcode");
    let (start, len) = match payload[11] >> 6 {
        0 => (12, usize::from(payload[11] & 0x3f)),
        1 => (
            13,
            usize::from(payload[11] & 0x3f) << 8 | usize::from(payload[12]),
        ),
        _ if payload[11] == 0x80 => {
            let len = u32::from_be_bytes(payload[12..16].try_into().unwrap());
            (16, len as usize)
        }
        _ => panic!("compressed payload: DUMP with rdbcompression no"),
    };
    assert_eq!(start + len + 11, payload.len(), "trailing bytes unknown");
    (start, len)
}

/// A DUMP payload carrying `codec` instead of the module bytes of
/// `template` (a real DUMP of any limiter, made with `rdbcompression no`),
/// with a valid CRC: what an attacker with RESTORE rights can send.
pub fn dump_with_codec(template: &[u8], codec: &[u8]) -> Vec<u8> {
    let (start, len) = codec_span(template);
    let mut out = template[..11].to_vec();
    match codec.len() {
        n if n < 64 => out.push(n as u8),
        n if n < 16384 => out.extend([0x40 | (n >> 8) as u8, n as u8]),
        n => {
            out.push(0x80);
            out.extend((n as u32).to_be_bytes());
        }
    }
    out.extend_from_slice(codec);
    out.extend_from_slice(&template[start + len..]);
    fix_dump_crc(&mut out);
    out
}

/// Waits until INFO `section` shows `name:value`.
pub fn wait_for(con: &mut Connection, section: &str, name: &str, value: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = info(con, section);
        if field(&text, name).as_deref() == Some(value) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} never became {value}:\n{text}"
        );
        sleep(Duration::from_millis(20));
    }
}

/// Server arguments for an AOF that fsyncs every write, with the RDB
/// preamble `yes` or `no`.
pub fn aof_args(preamble: &str) -> Vec<&str> {
    vec![
        "--appendonly",
        "yes",
        "--aof-use-rdb-preamble",
        preamble,
        "--appendfsync",
        "always",
    ]
}

/// Waits until no AOF rewrite is running or scheduled, and checks the last one succeeded.
pub fn wait_for_rewrite(con: &mut Connection) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = info(con, "persistence");
        if field(&text, "aof_rewrite_in_progress").as_deref() == Some("0")
            && field(&text, "aof_rewrite_scheduled").as_deref() == Some("0")
        {
            assert_eq!(
                field(&text, "aof_last_bgrewrite_status").as_deref(),
                Some("ok"),
                "{text}"
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "AOF rewrite did not finish:\n{text}"
        );
        sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------
// Valkey Cluster (six nodes): see cluster.rs.

pub mod cluster;
pub mod json;

// ---------------------------------------------------------------------------
// Servers run another way: another binary, extra environment (libfaketime,
// see clocks.rs), or killed outright (crash.rs).

impl Server {
    /// As [`Server::start_with`], but runs `binary` with `env` added to its
    /// environment. Only this start uses them: a later `restart` runs
    /// [`server_binary`] with the test's own environment.
    pub fn start_with_env(binary: &str, env: &[(&str, &str)], extra: &[&str]) -> Server {
        needs_own_server("a server run another way");
        let mut last_error = String::new();
        for _ in 0..8 {
            let dir = TempDir::new("valkey-rl-test");
            let mut server = Server {
                port: free_port(),
                host: "127.0.0.1".to_string(),
                external: None,
                first: Vec::new(),
                extra: extra.iter().map(|s| s.to_string()).collect(),
                child: None,
                log: dir.path.join("server.log"),
                dir,
            };
            let log = fs::File::create(&server.log).expect("create server log");
            let child = Command::new(binary)
                .args(server.args())
                .envs(env.iter().copied())
                .current_dir(server.dir())
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("clone log handle"))
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run {binary}: {e}"));
            let pid = child.id();
            server.child = Some(child);
            match server.wait_ready(pid) {
                Ok(()) => return server,
                // Dropping `server` kills the process and removes its directory.
                Err(StartError::PortTaken(why)) => last_error = why,
                Err(StartError::Failed(why)) => panic!("{binary} with {env:?}: {why}"),
            }
        }
        panic!("could not start {binary} on a free port: {last_error}");
    }

    /// Kills the server with SIGKILL (no shutdown, no final AOF flush or
    /// fsync) and waits for it to be gone. `restart(Shutdown::NoSave)` then
    /// starts it again on what it left in its directory.
    pub fn sigkill(&mut self) {
        self.kill();
    }
}

/// A replica of `primary` run as [`Server::start_with_env`]; waits for the
/// link to be up and for the replica to have caught up. (The primary may
/// have other replicas: [`sync_replica`] expects one.)
pub fn start_replica_with_env(primary: &Server, binary: &str, env: &[(&str, &str)]) -> Server {
    let port = primary.port.to_string();
    let extra = ["--replicaof", "127.0.0.1", &port, "--repl-timeout", "3600"];
    let replica = Server::start_with_env(binary, env, &extra);
    wait_for(
        &mut replica.conn(),
        "replication",
        "master_link_status",
        "up",
    );
    sync_replicas(primary, &[&replica]);
    replica
}

/// As [`sync_replica`] for a primary with any number of replicas: `WAIT`s
/// for `replicas.len()` acknowledgements, then until each replica's offset
/// reaches the primary's.
pub fn sync_replicas(primary: &Server, replicas: &[&Server]) {
    let mut pcon = primary.conn();
    let n = replicas.len() as i64;
    // WAIT counts every replica that acknowledged, ours or not.
    let acked = int(&q(&mut pcon, &argv!["WAIT", n, 5000]));
    assert!(
        acked >= n,
        "WAIT {n} 5000: only {acked} replicas acknowledged"
    );
    let target = repl_offset(&mut pcon);
    for replica in replicas {
        let mut rcon = replica.conn();
        let deadline = Instant::now() + Duration::from_secs(20);
        while repl_offset(&mut rcon) < target {
            assert!(
                Instant::now() < deadline,
                "replica on port {} did not reach primary offset {target}",
                replica.port
            );
            sleep(Duration::from_millis(10));
        }
    }
}
