//! A real Valkey Cluster of six nodes (three primaries, one replica each),
//! built by hand with CLUSTER ADDSLOTSRANGE / MEET / REPLICATE, every node on
//! 127.0.0.1 with the module loaded, each in its own temporary directory.
//! Every node is SIGKILLed when the [`Cluster`] is dropped (each [`Node`]'s
//! Drop), also on panic, after printing its log tail when panicking.
//!
//! Node indexes: 0, 1, 2 start as the primaries of slots 0-5460, 5461-10922
//! and 10923-16383; node 3 + i starts as the replica of node i. Failovers
//! change roles: ask [`Cluster::primary_for_slot`] / [`Cluster::replica_of`].
//!
//! Clusters of one test binary run one at a time (a process-wide lock), so a
//! 2-core machine is not asked to keep several clusters' failure detectors
//! happy at once.

use super::*;
use rand::Rng;
use redis::cluster::{ClusterClient, ClusterConnection};
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

pub const NODE_TIMEOUT_MS: u64 = 2000;
pub const SLOTS: u16 = 16384;
/// How long the cluster gets to converge after a change (failover, migration).
pub const CONVERGE_TIMEOUT: Duration = Duration::from_secs(60);

/// The server's major version (`valkey-server --version`: `... v=9.1.2 ...`).
pub fn server_major_version() -> u32 {
    server_version()
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("cannot parse the version of {}", server_binary()))
}

/// `x.y.z` of the server binary.
pub fn server_version() -> String {
    let out = Command::new(server_binary())
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} --version: {e}", server_binary()));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.split_whitespace()
        .find_map(|w| w.strip_prefix("v="))
        .unwrap_or_else(|| panic!("no v= in {text:?}"))
        .to_string()
}

/// Polls `check` until it returns `Ok`, panicking with its last message
/// after `timeout`.
pub fn wait_until<T>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match check() {
            Ok(v) => return v,
            Err(why) => {
                assert!(
                    Instant::now() < deadline,
                    "{what}: not reached in {timeout:?}: {why}"
                );
            }
        }
        sleep(Duration::from_millis(50));
    }
}

// ---------------------------------------------------------------------------
// Commands on any connection (plain or cluster)

pub fn craw<C: ConnectionLike>(con: &mut C, argv: &[String]) -> Value {
    let cmd = to_cmd(argv);
    con.req_command(&cmd)
        .unwrap_or_else(|e| panic!("I/O error on {argv:?}: {e}"))
}

pub fn ctry<C: ConnectionLike>(con: &mut C, argv: &[String]) -> Result<Value, String> {
    let cmd = to_cmd(argv);
    match con.req_command(&cmd) {
        Ok(v) => match error_of(&v) {
            Some(e) => Err(e),
            None => Ok(v),
        },
        // The cluster client surfaces server errors (MOVED, ...) as Err.
        Err(e) => Err(match (e.code(), e.detail()) {
            (Some(code), Some(detail)) => format!("{code} {detail}"),
            _ => e.to_string(),
        }),
    }
}

pub fn cq<C: ConnectionLike>(con: &mut C, argv: &[String]) -> Value {
    ctry(con, argv).unwrap_or_else(|e| panic!("{argv:?} failed: {e}"))
}

pub fn crl<C: ConnectionLike>(con: &mut C, argv: &[String]) -> Reply {
    Reply::parse(&cq(con, argv))
}

// ---------------------------------------------------------------------------
// One node

pub struct Node {
    pub port: u16,
    /// The 40-hex node id (CLUSTER MYID).
    pub id: String,
    child: Option<Child>,
    log: PathBuf,
    // Dropped last: the child is killed before its directory goes.
    dir: TempDir,
}

impl Node {
    /// A port below 55535 whose cluster bus port (+10000) is free too. Both
    /// stay below Linux's ephemeral range (32768-60999), where
    /// [`Server`]'s ports come from, so clusters and plain servers of
    /// concurrently running tests do not collide.
    fn pick_port() -> u16 {
        let mut rng = rand::thread_rng();
        loop {
            let port: u16 = rng.gen_range(10_000..22_700);
            let a = TcpListener::bind(("127.0.0.1", port));
            let b = TcpListener::bind(("127.0.0.1", port + 10_000));
            if a.is_ok() && b.is_ok() {
                return port;
            }
        }
    }

    fn start(extra: &[&str]) -> Node {
        let module = module_path();
        assert!(
            module.exists(),
            "module not found at {module:?}: build it with `cargo build --release` or set RL_MODULE"
        );
        let mut last = String::new();
        for _ in 0..10 {
            let port = Node::pick_port();
            let dir = TempDir::new("valkey-rl-cluster");
            let log = dir.path.join("server.log");
            let mut args = argv![
                "--port",
                port,
                "--bind",
                "127.0.0.1",
                "--dir",
                dir.path.display(),
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                format!("nodes-{port}.conf"),
                "--cluster-node-timeout",
                NODE_TIMEOUT_MS,
                // A replica whose link has been down for a while may still
                // be elected: the tests decide what data loss is allowed.
                "--cluster-replica-validity-factor",
                0,
                "--cluster-allow-replica-migration",
                "no",
                "--enable-debug-command",
                "yes",
                "--appendonly",
                "no",
                "--save",
                "",
                "--loadmodule",
                module.display()
            ];
            args.extend(extra.iter().map(|s| s.to_string()));
            let logf = fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .expect("open node log");
            let child = Command::new(server_binary())
                .args(&args)
                .current_dir(&dir.path)
                .stdin(Stdio::null())
                .stdout(logf.try_clone().expect("clone log handle"))
                .stderr(logf)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", server_binary()));
            let pid = child.id();
            let mut node = Node {
                port,
                id: String::new(),
                child: Some(child),
                log,
                dir,
            };
            match node.wait_ready(pid) {
                Ok(()) => {
                    let mut con = node.conn();
                    node.id = string(&q(&mut con, &argv!["CLUSTER", "MYID"]));
                    assert_eq!(node.id.len(), 40, "CLUSTER MYID: {:?}", node.id);
                    return node;
                }
                Err(Some(why)) => last = why, // port taken: try another
                Err(None) => unreachable!(),
            }
        }
        panic!("could not start a cluster node on a free port: {last}");
    }

    /// `Err(Some(why))` when the port was taken; panics on other failures.
    fn wait_ready(&mut self, pid: u32) -> Result<(), Option<String>> {
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
                    return Err(Some(log));
                }
                panic!("cluster node exited at start ({status}); log tail:\n{log}");
            }
            if let Ok(mut con) = self.try_conn() {
                if let Ok(Value::SimpleString(pong)) = con.req_command(&redis::cmd("PING")) {
                    if pong == "PONG" {
                        let server_pid =
                            field(&info(&mut con, "server"), "process_id").unwrap_or_default();
                        if server_pid != pid.to_string() {
                            self.kill();
                            return Err(Some(format!(
                                "port {} answered by pid {server_pid}, ours is {pid}",
                                self.port
                            )));
                        }
                        return Ok(());
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "cluster node did not answer PING within {START_TIMEOUT:?}; log tail:\n{}",
                self.log_tail(40)
            );
            sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn try_conn(&self) -> redis::RedisResult<Connection> {
        let client = redis::Client::open(self.url())?;
        let con = client.get_connection_with_timeout(Duration::from_secs(2))?;
        con.set_read_timeout(Some(IO_TIMEOUT))?;
        con.set_write_timeout(Some(IO_TIMEOUT))?;
        Ok(con)
    }

    /// A plain RESP2 connection to this node (no redirections followed).
    pub fn conn(&self) -> Connection {
        self.try_conn()
            .unwrap_or_else(|e| panic!("connect to {}: {e}\n{}", self.url(), self.log_tail(20)))
    }

    pub fn dir(&self) -> &Path {
        &self.dir.path
    }

    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn is_alive(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// SIGKILL: no shutdown, no last words to replicas.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `role` from INFO replication: `master` or `slave`.
    pub fn role(&self) -> String {
        let mut con = self.conn();
        field(&info(&mut con, "replication"), "role").unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if std::thread::panicking() && self.child.is_some() {
            eprintln!(
                "---- cluster node {} ({}) log tail ----\n{}\n----",
                self.port,
                self.id,
                self.log_tail(25)
            );
        }
        self.kill();
    }
}

// ---------------------------------------------------------------------------
// CLUSTER NODES

/// One line of CLUSTER NODES.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeLine {
    pub id: String,
    pub port: u16,
    pub flags: Vec<String>,
    /// The primary's id for a replica, `-` for a primary.
    pub primary: String,
    pub link: String,
    /// Slot ranges and migration markers as printed (`0-5460`, `[42->-id]`).
    pub slots: Vec<String>,
}

impl NodeLine {
    pub fn is_primary(&self) -> bool {
        self.flags.iter().any(|f| f == "master")
    }
    pub fn failed(&self) -> bool {
        self.flags.iter().any(|f| f == "fail" || f == "fail?")
    }
    pub fn myself(&self) -> bool {
        self.flags.iter().any(|f| f == "myself")
    }
    /// Whether this node serves `slot` (migration markers ignored).
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().filter(|s| !s.starts_with('[')).any(|s| {
            let (a, b) = s.split_once('-').unwrap_or((s, s));
            let (a, b): (u16, u16) = (a.parse().unwrap(), b.parse().unwrap());
            (a..=b).contains(&slot)
        })
    }
}

pub fn parse_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let parts: Vec<&str> = line.split_whitespace().collect();
            assert!(parts.len() >= 8, "CLUSTER NODES line: {line:?}");
            // 127.0.0.1:port@bus[,hostname]
            let port = parts[1]
                .split('@')
                .next()
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            NodeLine {
                id: parts[0].to_string(),
                port,
                flags: parts[2].split(',').map(str::to_string).collect(),
                primary: parts[3].to_string(),
                link: parts[7].to_string(),
                slots: parts[8..].iter().map(|s| s.to_string()).collect(),
            }
        })
        .collect()
}

pub fn cluster_nodes(con: &mut Connection) -> Vec<NodeLine> {
    parse_nodes(&string(&q(con, &argv!["CLUSTER", "NODES"])))
}

pub fn cluster_info_field(con: &mut Connection, name: &str) -> Option<String> {
    field(&string(&q(con, &argv!["CLUSTER", "INFO"])), name)
}

// ---------------------------------------------------------------------------
// The cluster

static SERIAL: Mutex<()> = Mutex::new(());

pub struct Cluster {
    pub nodes: Vec<Node>,
    // Dropped after the nodes.
    _serial: MutexGuard<'static, ()>,
}

impl Cluster {
    pub const PRIMARIES: usize = 3;

    pub fn start() -> Cluster {
        Cluster::start_with(&[])
    }

    /// Six nodes with extra server arguments each.
    pub fn start_with(extra: &[&str]) -> Cluster {
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let nodes: Vec<Node> = (0..2 * Cluster::PRIMARIES)
            .map(|_| Node::start(extra))
            .collect();
        let mut cluster = Cluster {
            nodes,
            _serial: serial,
        };
        cluster.form();
        cluster
    }

    fn form(&mut self) {
        let n = Cluster::PRIMARIES as u32;
        for i in 0..Cluster::PRIMARIES {
            let first = u32::from(SLOTS) * i as u32 / n;
            let last = u32::from(SLOTS) * (i as u32 + 1) / n - 1;
            let mut con = self.nodes[i].conn();
            q(&mut con, &argv!["CLUSTER", "ADDSLOTSRANGE", first, last]);
        }
        let mut con0 = self.nodes[0].conn();
        for node in &self.nodes[1..] {
            q(&mut con0, &argv!["CLUSTER", "MEET", "127.0.0.1", node.port]);
        }
        let total = self.nodes.len().to_string();
        for node in &self.nodes {
            let mut con = node.conn();
            wait_until(
                &format!("node {} knows every node", node.port),
                CONVERGE_TIMEOUT,
                || {
                    let known = cluster_info_field(&mut con, "cluster_known_nodes");
                    let lines = cluster_nodes(&mut con);
                    if known.as_deref() == Some(total.as_str())
                        && lines
                            .iter()
                            .all(|l| !l.flags.iter().any(|f| f == "handshake"))
                    {
                        Ok(())
                    } else {
                        Err(format!("known {known:?}: {lines:?}"))
                    }
                },
            );
        }
        for i in 0..Cluster::PRIMARIES {
            let primary_id = self.nodes[i].id.clone();
            let mut con = self.nodes[Cluster::PRIMARIES + i].conn();
            wait_until("CLUSTER REPLICATE", CONVERGE_TIMEOUT, || {
                ctry(&mut con, &argv!["CLUSTER", "REPLICATE", &primary_id]).map(|_| ())
            });
        }
        self.wait_converged();
        self.wait_replicas_synced();
    }

    /// The nodes that have not been killed.
    pub fn alive(&mut self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].is_alive())
            .collect()
    }

    pub fn index_of_id(&self, id: &str) -> usize {
        self.nodes
            .iter()
            .position(|n| n.id == id)
            .unwrap_or_else(|| panic!("no node with id {id}"))
    }

    pub fn index_of_port(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.port == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
    }

    /// Waits until every live node reports cluster_state:ok with all slots
    /// assigned and all live nodes print the same CLUSTER NODES view (roles,
    /// primaries, slots, failure flags), with no migration in progress.
    /// Waits until `promoted` is a primary and `demoted` a replica.
    pub fn wait_swapped(&self, promoted: usize, demoted: usize) {
        wait_until("roles swapped", CONVERGE_TIMEOUT, || {
            let roles = (self.nodes[promoted].role(), self.nodes[demoted].role());
            if roles == ("master".to_string(), "slave".to_string()) {
                Ok(())
            } else {
                Err(format!("{roles:?}"))
            }
        });
    }

    pub fn wait_converged(&mut self) {
        let alive = self.alive();
        let ports: Vec<u16> = alive.iter().map(|&i| self.nodes[i].port).collect();
        let logs: String = alive
            .iter()
            .map(|&i| {
                format!(
                    "node {}:\n{}\n",
                    self.nodes[i].port,
                    self.nodes[i].log_tail(15)
                )
            })
            .collect();
        let nodes = &self.nodes;
        let check = || -> Result<(), String> {
            let mut views = Vec::new();
            for &i in &alive {
                let mut con = nodes[i]
                    .try_conn()
                    .map_err(|e| format!("connect {}: {e}", nodes[i].port))?;
                let text = string(&q(&mut con, &argv!["CLUSTER", "INFO"]));
                for (name, want) in [("cluster_state", "ok"), ("cluster_slots_assigned", "16384")] {
                    let got = field(&text, name);
                    if got.as_deref() != Some(want) {
                        return Err(format!("node {}: {name}={got:?}", nodes[i].port));
                    }
                }
                let mut view: Vec<(String, bool, String, bool, Vec<String>)> =
                    cluster_nodes(&mut con)
                        .into_iter()
                        .map(|l| {
                            let failed = l.flags.iter().any(|f| f == "fail");
                            let primary = l.is_primary();
                            if l.flags.iter().any(|f| f == "fail?") && ports.contains(&l.port) {
                                // A live node suspected by someone: not settled yet.
                                return (l.id, primary, "pfail".into(), failed, l.slots);
                            }
                            (l.id, primary, l.primary, failed, l.slots)
                        })
                        .collect();
                view.sort();
                if view.iter().any(|v| v.2 == "pfail") {
                    return Err(format!(
                        "node {} suspects a live node: {view:?}",
                        nodes[i].port
                    ));
                }
                if view.iter().any(|v| v.4.iter().any(|s| s.starts_with('['))) {
                    return Err(format!(
                        "node {}: migration markers: {view:?}",
                        nodes[i].port
                    ));
                }
                views.push(view);
            }
            // Dead nodes must be flagged `fail` by everyone.
            for view in &views {
                for v in view {
                    let i = nodes.iter().position(|n| n.id == v.0);
                    let dead = i.is_some_and(|i| !alive.contains(&i));
                    if dead && !v.3 {
                        return Err(format!("dead node {} not flagged fail yet", v.0));
                    }
                }
            }
            if views.windows(2).all(|w| w[0] == w[1]) {
                Ok(())
            } else {
                Err(format!("views differ: {views:#?}"))
            }
        };
        let deadline = Instant::now() + CONVERGE_TIMEOUT;
        loop {
            match check() {
                Ok(()) => return,
                Err(why) => assert!(
                    Instant::now() < deadline,
                    "cluster did not converge in {CONVERGE_TIMEOUT:?}: {why}\n{logs}"
                ),
            }
            sleep(Duration::from_millis(50));
        }
    }

    /// The current view of node `via`.
    pub fn view(&self, via: usize) -> Vec<NodeLine> {
        cluster_nodes(&mut self.nodes[via].conn())
    }

    fn any_alive(&mut self) -> usize {
        *self.alive().first().expect("no live node")
    }

    /// The index of the primary serving `slot` (as a live node sees it).
    pub fn primary_for_slot(&mut self, slot: u16) -> usize {
        let via = self.any_alive();
        let view = self.view(via);
        let line = view
            .iter()
            .find(|l| l.is_primary() && !l.failed() && l.serves(slot))
            .unwrap_or_else(|| panic!("nobody serves slot {slot}: {view:?}"));
        self.index_of_id(&line.id)
    }

    pub fn primary_for_key(&mut self, key: &str) -> usize {
        let slot = self.slot(key);
        self.primary_for_slot(slot)
    }

    /// CLUSTER KEYSLOT, asked of a live node.
    pub fn slot(&mut self, key: &str) -> u16 {
        let via = self.any_alive();
        let mut con = self.nodes[via].conn();
        int(&q(&mut con, &argv!["CLUSTER", "KEYSLOT", key])) as u16
    }

    /// For every slot, the index of the primary serving it (one node's view).
    pub fn slot_map(&mut self) -> Vec<usize> {
        let via = self.any_alive();
        let view = self.view(via);
        let mut map = vec![usize::MAX; usize::from(SLOTS)];
        for line in view.iter().filter(|l| l.is_primary() && !l.failed()) {
            let index = self.index_of_id(&line.id);
            for s in line.slots.iter().filter(|s| !s.starts_with('[')) {
                let (a, b) = s.split_once('-').unwrap_or((s, s));
                let (a, b): (usize, usize) = (a.parse().unwrap(), b.parse().unwrap());
                for slot in &mut map[a..=b] {
                    *slot = index;
                }
            }
        }
        assert!(
            map.iter().all(|&i| i != usize::MAX),
            "unserved slots in {view:?}"
        );
        map
    }

    /// The live replica of primary `primary`.
    pub fn replica_of(&mut self, primary: usize) -> usize {
        let id = self.nodes[primary].id.clone();
        let view = self.view(primary);
        let line = view
            .iter()
            .find(|l| l.primary == id && !l.failed())
            .unwrap_or_else(|| panic!("node {primary} has no replica: {view:?}"));
        self.index_of_id(&line.id)
    }

    /// The current primaries (live, serving slots), by index.
    pub fn primaries(&mut self) -> Vec<usize> {
        let via = self.any_alive();
        let view = self.view(via);
        let mut out: Vec<usize> = view
            .iter()
            .filter(|l| l.is_primary() && !l.failed() && !l.slots.is_empty())
            .map(|l| self.index_of_id(&l.id))
            .collect();
        out.sort();
        out
    }

    /// Waits until every live replica's link is up and its offset has
    /// reached its primary's.
    pub fn wait_replicas_synced(&mut self) {
        for p in self.primaries() {
            let r = self.replica_of(p);
            self.sync(p, r);
        }
    }

    /// Waits until replica `r` has everything primary `p` has written.
    pub fn sync(&self, p: usize, r: usize) {
        let mut rcon = self.nodes[r].conn();
        wait_until(
            &format!("replica {} link up", self.nodes[r].port),
            CONVERGE_TIMEOUT,
            || {
                let text = info(&mut rcon, "replication");
                if field(&text, "master_link_status").as_deref() == Some("up")
                    && field(&text, "master_port").as_deref()
                        == Some(&self.nodes[p].port.to_string())
                {
                    Ok(())
                } else {
                    Err(text)
                }
            },
        );
        let mut pcon = self.nodes[p].conn();
        let target = repl_offset(&mut pcon);
        wait_until(
            &format!("replica {} caught up", self.nodes[r].port),
            CONVERGE_TIMEOUT,
            || {
                let at = repl_offset(&mut rcon);
                if at >= target {
                    Ok(())
                } else {
                    Err(format!("offset {at} < {target}"))
                }
            },
        );
    }

    /// A cluster client seeded with every live node.
    pub fn client(&mut self) -> ClusterConnection {
        let urls: Vec<String> = self.alive().iter().map(|&i| self.nodes[i].url()).collect();
        ClusterClient::builder(urls)
            .connection_timeout(Duration::from_secs(2))
            .response_timeout(IO_TIMEOUT)
            .build()
            .expect("cluster client")
            .get_connection()
            .expect("cluster connection")
    }

    /// SIGKILLs node `i`.
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].kill();
    }

    /// Keys named `prefix<n>` with no hash tag, grouped by the primary that
    /// serves them, `per_primary` for each primary.
    pub fn keys_by_primary(
        &mut self,
        prefix: &str,
        per_primary: usize,
    ) -> BTreeMap<usize, Vec<String>> {
        let primaries = self.primaries();
        let map = self.slot_map();
        let mut out: BTreeMap<usize, Vec<String>> =
            primaries.iter().map(|&p| (p, Vec::new())).collect();
        let mut n = 0;
        while out.values().any(|v| v.len() < per_primary) {
            let key = format!("{prefix}{n}");
            n += 1;
            let p = map[usize::from(redis::cluster_routing::get_slot(key.as_bytes()))];
            let keys = out.get_mut(&p).expect("a primary");
            if keys.len() < per_primary {
                keys.push(key);
            }
        }
        out
    }
}

// ---------------------------------------------------------------------------
// Live limiters in one slot, and checking they moved intact

/// Limit and period of the limiters [`populate`] creates.
pub const LIMIT: u64 = 5;
pub const PERIOD: &str = "1h";

/// The algorithm of the i-th key [`populate`] creates.
pub fn algo_of(i: usize) -> Algo {
    Algo::ALL[i % 4]
}

/// `n` keys `rl:{<tag>}:<i>` (one slot), algorithm [`algo_of`]`(i)`, limit
/// [`LIMIT`] per [`PERIOD`], each called `i % 7 + 1` times: some have room
/// left, some are exhausted (denied calls included). Runs on `con` (a plain
/// connection to the owner or a cluster connection).
pub fn populate<C: ConnectionLike>(con: &mut C, tag: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let key = format!("rl:{{{tag}}}:{i}");
            for call in 0..(i % 7 + 1) {
                let r = crl(con, &algo_of(i).cmd(&key, LIMIT, PERIOD));
                assert_eq!(r.allowed, (call as u64) < LIMIT, "{key} call {call}: {r:?}");
            }
            key
        })
        .collect()
}

/// What a limiter key looks like before it moves.
#[derive(Clone, Debug)]
pub struct KeySnap {
    pub key: String,
    pub algo: Algo,
    pub digest: String,
    pub expire_at: i64,
    /// The DRYRUN reply: the decision the next call would get.
    pub next: Reply,
}

pub fn snapshot(con: &mut Connection, keys: &[String]) -> Vec<KeySnap> {
    keys.iter()
        .enumerate()
        .map(|(i, key)| {
            let algo = algo_of(i);
            let snap = KeySnap {
                key: key.clone(),
                algo,
                digest: digest(con, key),
                expire_at: pexpiretime(con, key),
                next: rl(con, &algo.cmd_with(key, LIMIT, PERIOD, &["DRYRUN"])),
            };
            assert_ne!(snap.digest, "0".repeat(40), "{key} is absent");
            assert!(snap.expire_at > 0, "{key} has no expiry");
            snap
        })
        .collect()
}

/// The keys on `con` have the snapshot's digests, and expiries within
/// `expire_slack_ms` after the snapshot's (0: identical).
pub fn assert_same_state(
    con: &mut Connection,
    snaps: &[KeySnap],
    expire_slack_ms: i64,
    where_: &str,
) {
    for s in snaps {
        assert_eq!(
            digest(con, &s.key),
            s.digest,
            "{} ({}): DEBUG DIGEST-VALUE on {where_}",
            s.key,
            s.algo.name()
        );
        let at = pexpiretime(con, &s.key);
        assert!(
            (0..=expire_slack_ms).contains(&(at - s.expire_at)),
            "{} ({}): PEXPIRETIME on {where_} is {at}, was {} (allowed slack {expire_slack_ms} ms)",
            s.key,
            s.algo.name(),
            s.expire_at
        );
    }
}

/// The next real call on `con` gets the decision the snapshot's DRYRUN
/// predicted, and then exactly the predicted number of further calls is
/// allowed before the first denial: no budget lost, none handed back.
pub fn assert_same_decisions(con: &mut Connection, snaps: &[KeySnap], where_: &str) {
    for s in snaps {
        let cmd = s.algo.cmd(&s.key, LIMIT, PERIOD);
        let first = rl(con, &cmd);
        assert_eq!(
            (first.allowed, first.limit, first.remaining),
            (s.next.allowed, s.next.limit, s.next.remaining),
            "{} ({}): first call on {where_} vs DRYRUN before: {first:?} vs {:?}",
            s.key,
            s.algo.name(),
            s.next
        );
        let mut more = 0;
        loop {
            let r = rl(con, &cmd);
            if !r.allowed {
                break;
            }
            more += 1;
            assert!(more <= LIMIT as i64, "{}: never denied", s.key);
        }
        let expected = if s.next.allowed { s.next.remaining } else { 0 };
        assert_eq!(
            more,
            expected,
            "{} ({}): calls allowed on {where_} after the first",
            s.key,
            s.algo.name()
        );
    }
}
