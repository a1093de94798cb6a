//! Stored policies (RL.POLICY.SET/GET/DEL/LIST, RL.LIMIT) against a real
//! server: the same decisions as the algorithm's own command, a change that
//! reaches every key at once, replication, full syncs, RDB and AOF.

mod common;

use common::*;
use redis::{Connection, Value};

fn set(con: &mut Connection, name: &str, definition: &[&str]) {
    let mut cmd = argv!["RL.POLICY.SET", name];
    cmd.extend(definition.iter().map(|w| w.to_string()));
    assert_eq!(q(con, &cmd), Value::Okay);
}

fn list(con: &mut Connection) -> Vec<String> {
    array(&q(con, &argv!["RL.POLICY.LIST"]))
        .iter()
        .map(string)
        .collect()
}

fn get(con: &mut Connection, name: &str) -> Option<Vec<String>> {
    match q(con, &argv!["RL.POLICY.GET", name]) {
        Value::Nil => None,
        v => Some(array(&v).iter().map(string).collect()),
    }
}

/// Every algorithm as a policy and as its own command (key appended later).
const DEFINITIONS: [(&str, &[&str], &[&str]); 6] = [
    (
        "tb",
        &["TOKENBUCKET", "4", "1", "1h"],
        &["RL.TOKENBUCKET", "4", "1", "1h"],
    ),
    ("fw", &["WINDOW", "4", "1h"], &["RL.WINDOW", "4", "1h"]),
    (
        "sw",
        &["window", "4", "1h", "sliding"],
        &["RL.WINDOW", "4", "1h", "SLIDING"],
    ),
    (
        "log",
        &["SLIDINGLOG", "4", "1h"],
        &["RL.SLIDINGLOG", "4", "1h"],
    ),
    (
        "logc",
        &["SLIDINGLOG", "4", "1h", "COUNTDENIED"],
        &["RL.SLIDINGLOG", "4", "1h", "COUNTDENIED"],
    ),
    (
        "gcra",
        &["GCRA", "4", "1", "1h"],
        &["RL.GCRA", "4", "1", "1h"],
    ),
];

fn define_all(con: &mut Connection) {
    for (name, definition, _) in DEFINITIONS {
        set(con, name, definition);
    }
}

fn direct(command: &[&str], key: &str, options: &[&str]) -> Vec<String> {
    let mut cmd = argv![command[0], key];
    cmd.extend(command[1..].iter().chain(options).map(|w| w.to_string()));
    cmd
}

fn limited(key: &str, policy: &str, options: &[&str]) -> Vec<String> {
    let mut cmd = argv!["RL.LIMIT", key, policy];
    cmd.extend(options.iter().map(|w| w.to_string()));
    cmd
}

#[test]
fn rl_limit_decides_exactly_as_the_algorithms_own_command() {
    let server = Server::start();
    let mut con = server.conn();
    avoid_boundary(&mut con, ONE_HOUR_MS, 60_000);
    define_all(&mut con);
    let calls: [&[&str]; 7] = [
        &[],
        &["COST", "2"],
        &["DRYRUN"],
        &["BRIEF"],
        &["COST", "3", "PARTIAL"],
        &[],
        &["COST", "0"],
    ];
    for (name, _, command) in DEFINITIONS {
        let (a, b) = (format!("via-policy:{name}"), format!("direct:{name}"));
        // Both keys answer in one MULTI: the same instant.
        for options in calls {
            let replies = exec(
                &mut con,
                &[limited(&a, name, options), direct(command, &b, options)],
            );
            assert_eq!(replies[0], replies[1], "{name} {options:?}");
        }
        assert_eq!(digest(&mut con, &a), digest(&mut con, &b), "{name}");
        assert_eq!(
            pexpiretime(&mut con, &a),
            pexpiretime(&mut con, &b),
            "{name}"
        );
    }
}

#[test]
fn a_changed_policy_applies_to_every_key_at_its_next_call() {
    let server = Server::start();
    let mut con = server.conn();
    avoid_boundary(&mut con, ONE_HOUR_MS, 60_000);
    set(&mut con, "api", &["WINDOW", "3", "1h"]);
    let keys = ["user:1", "user:2", "user:3"];
    for key in keys {
        for _ in 0..3 {
            assert!(rl(&mut con, &limited(key, "api", &[])).allowed);
        }
        assert!(!rl(&mut con, &limited(key, "api", &[])).allowed, "{key}");
    }
    set(&mut con, "api", &["WINDOW", "5", "1h"]);
    for key in keys {
        let r = rl(&mut con, &limited(key, "api", &[]));
        assert_eq!(
            (r.allowed, r.limit, r.remaining),
            (true, 5, 1),
            "{key}: {r:?}"
        );
    }
    // A key called with a different algorithm than it holds is refused, as
    // the algorithm's own command would be; nothing changes.
    set(&mut con, "api", &["TOKENBUCKET", "5", "1", "1h"]);
    let before = digest(&mut con, "user:1");
    let error = q_err(&mut con, &limited("user:1", "api", &[]));
    let direct_error = q_err(&mut con, &argv!["RL.TOKENBUCKET", "user:1", 5, 1, "1h"]);
    assert_eq!(error, direct_error);
    assert_eq!(digest(&mut con, "user:1"), before);
}

#[test]
fn definitions_and_names_are_checked_and_errors_write_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    set(&mut con, "ok", &["GCRA", "10", "1", "1s"]);
    let bad: [(&[&str], &str); 8] = [
        (
            &["RL.POLICY.SET", "p", "BUCKET", "1", "1", "1s"],
            "must start with TOKENBUCKET",
        ),
        (
            &["RL.POLICY.SET", "p", "WINDOW", "0", "1s"],
            "limit must be",
        ),
        (
            &["RL.POLICY.SET", "p", "WINDOW", "5", "0s"],
            "period must be",
        ),
        (
            &["RL.POLICY.SET", "p", "TOKENBUCKET", "5", "1"],
            "lacks arguments",
        ),
        (
            &["RL.POLICY.SET", "p", "WINDOW", "5", "1s", "COST", "2"],
            "unexpected 'COST'",
        ),
        (
            &["RL.POLICY.SET", "", "WINDOW", "5", "1s"],
            "policy name must be",
        ),
        (&["RL.LIMIT", "k", "nope"], "no policy named 'nope'"),
        (
            &["RL.LIMIT", "k", "ok", "SLIDING"],
            "unknown option 'SLIDING'",
        ),
    ];
    for (cmd, expected) in bad {
        let cmd: Vec<String> = cmd.iter().map(|w| w.to_string()).collect();
        let error = q_err(&mut con, &cmd);
        assert!(
            error.starts_with("ERR") && error.contains(expected),
            "{cmd:?}: {error}"
        );
    }
    let long = "x".repeat(129);
    assert!(
        q_err(&mut con, &argv!["RL.POLICY.SET", long, "WINDOW", 5, "1s"])
            .contains("1 to 128 bytes")
    );
    set(&mut con, "logc", &["SLIDINGLOG", "5", "1s", "COUNTDENIED"]);
    assert!(q_err(&mut con, &limited("k", "logc", &["BLOCK", "1s"])).contains("COUNTDENIED"));
    assert_eq!(list(&mut con), ["logc", "ok"]);
    assert!(!exists(&mut con, "k"), "a refused RL.LIMIT writes nothing");
    assert_eq!(get(&mut con, "ok").unwrap(), ["GCRA", "10", "1", "1s"]);
    assert_eq!(get(&mut con, "nope"), None);
    assert_eq!(
        int(&q(&mut con, &argv!["RL.POLICY.DEL", "ok", "nope", "logc"])),
        2
    );
    assert!(list(&mut con).is_empty());
}

#[test]
fn rl_limit_waits_with_block() {
    let server = Server::start();
    let mut con = server.conn();
    set(&mut con, "one", &["TOKENBUCKET", "1", "1", "300ms"]);
    assert!(rl(&mut con, &limited("b", "one", &[])).allowed);
    let started = std::time::Instant::now();
    let r = rl(&mut con, &limited("b", "one", &["BLOCK", "5s"]));
    let elapsed = started.elapsed();
    assert!(r.allowed, "{r:?}");
    assert!(
        elapsed >= std::time::Duration::from_millis(200),
        "granted after {elapsed:?}, before a token came back"
    );
}

#[test]
fn policies_reach_replicas_and_a_full_sync_replaces_stale_ones() {
    let (primary, replica) = primary_and_replica(&[]);
    let mut con = primary.conn();
    let mut rcon = replica.conn();
    define_all(&mut con);
    for (name, _, _) in DEFINITIONS {
        for i in 0..3 {
            rl(&mut con, &limited(&format!("r:{name}:{i}"), name, &[]));
        }
    }
    q(&mut con, &argv!["RL.POLICY.DEL", "gcra"]);
    sync_replica(&primary, &replica);
    assert_eq!(list(&mut rcon), list(&mut con));
    for (name, _, _) in DEFINITIONS {
        assert_eq!(get(&mut rcon, name), get(&mut con, name), "{name}");
        let keys: Vec<String> = (0..3).map(|i| format!("r:{name}:{i}")).collect();
        assert_eq!(
            digests_and_expiries(&mut rcon, &keys),
            digests_and_expiries(&mut con, &keys)
        );
    }
    let error = q_err(&mut rcon, &argv!["RL.POLICY.SET", "x", "WINDOW", 1, "1s"]);
    assert!(error.starts_with("READONLY"), "{error}");
    assert_eq!(
        get(&mut rcon, "fw").unwrap(),
        ["WINDOW", "4", "1h"],
        "GET runs on replicas"
    );

    // A server with a policy of its own becomes a replica: the sync replaces it.
    let other = Server::start();
    let mut ocon = other.conn();
    set(&mut ocon, "stale", &["WINDOW", "1", "1s"]);
    q(&mut ocon, &argv!["REPLICAOF", "127.0.0.1", primary.port]);
    wait_for(&mut ocon, "replication", "master_link_status", "up");
    sync_replicas(&primary, &[&replica, &other]);
    assert_eq!(list(&mut ocon), list(&mut con));

    // And when the primary has none at all (nothing in its RDB's aux data).
    let empty = Server::start();
    q(&mut ocon, &argv!["REPLICAOF", "127.0.0.1", empty.port]);
    wait_for(&mut ocon, "replication", "master_link_status", "up");
    sync_replica(&empty, &other);
    assert!(list(&mut ocon).is_empty(), "{:?}", list(&mut ocon));
}

fn assert_kept(server: &mut Server, how: &str) {
    let mut con = server.conn();
    assert_eq!(
        list(&mut con),
        ["fw", "gcra", "log", "logc", "sw", "tb"],
        "{how}"
    );
    for (name, definition, _) in DEFINITIONS {
        assert_eq!(get(&mut con, name).unwrap(), definition, "{how}: {name}");
    }
    // Usable: the key left with 3 of 4 used has one left.
    let r = rl(&mut con, &limited("kept", "fw", &[]));
    assert_eq!((r.allowed, r.remaining), (true, 0), "{how}: {r:?}");
    q(&mut con, &argv!["RL.REFUND", "kept", 1]);
}

#[test]
fn policies_survive_rdb_reload_and_restart() {
    let mut server = Server::start();
    let mut con = server.conn();
    avoid_boundary(&mut con, ONE_HOUR_MS, 60_000);
    define_all(&mut con);
    for _ in 0..3 {
        rl(&mut con, &limited("kept", "fw", &[]));
    }
    q(&mut con, &argv!["DEBUG", "RELOAD"]);
    assert_kept(&mut server, "DEBUG RELOAD");
    server.restart(Shutdown::Save);
    assert_kept(&mut server, "restart from the RDB");
}

#[test]
fn policies_survive_the_aof_with_and_without_preamble() {
    for preamble in ["yes", "no"] {
        let mut server = Server::start_with(&aof_args(preamble));
        let mut con = server.conn();
        avoid_boundary(&mut con, ONE_HOUR_MS, 60_000);
        set(&mut con, "gone", &["WINDOW", "9", "1h"]);
        define_all(&mut con);
        q(&mut con, &argv!["RL.POLICY.DEL", "gone"]);
        for _ in 0..3 {
            rl(&mut con, &limited("kept", "fw", &[]));
        }
        server.restart(Shutdown::NoSave);
        assert_kept(&mut server, &format!("AOF replay, preamble {preamble}"));
        let mut con = server.conn();
        q(&mut con, &argv!["BGREWRITEAOF"]);
        wait_for_rewrite(&mut con);
        server.restart(Shutdown::NoSave);
        assert_kept(&mut server, &format!("rewritten AOF, preamble {preamble}"));
    }
}

#[test]
fn an_application_user_applies_policies_but_cannot_change_them() {
    let server = Server::start();
    let mut admin = server.conn();
    set(&mut admin, "api", &["WINDOW", "5", "1h"]);
    q(
        &mut admin,
        &argv![
            "ACL",
            "SETUSER",
            "app",
            "on",
            ">secret",
            "~rl:*",
            "+@ratelimit"
        ],
    );
    let mut app = server.conn_as("app", "secret");
    assert!(rl(&mut app, &limited("rl:1", "api", &[])).allowed);
    assert_eq!(list(&mut app), ["api"]);
    for cmd in [
        argv!["RL.POLICY.SET", "api", "WINDOW", 1000, "1h"],
        argv!["RL.POLICY.DEL", "api"],
    ] {
        let error = q_err(&mut app, &cmd);
        assert!(error.starts_with("NOPERM"), "{cmd:?}: {error}");
    }
    assert_eq!(get(&mut admin, "api").unwrap(), ["WINDOW", "5", "1h"]);
}

#[test]
fn rl_all_takes_stored_policies_beside_inline_limiters() {
    let server = Server::start();
    let mut con = server.conn();
    avoid_boundary(&mut con, ONE_HOUR_MS, 60_000);
    set(&mut con, "per-user", &["WINDOW", "3", "1h"]);
    let by_name = argv![
        "RL.ALL",
        2,
        "all:a:user",
        "all:a:ip",
        "POLICY",
        "per-user",
        "GCRA",
        5,
        1,
        "1h",
        "COST",
        1
    ];
    let inline = argv![
        "RL.ALL",
        2,
        "all:b:user",
        "all:b:ip",
        "WINDOW",
        3,
        "1h",
        "GCRA",
        5,
        1,
        "1h",
        "COST",
        1
    ];
    for _ in 0..5 {
        let replies = exec(&mut con, &[by_name.clone(), inline.clone()]);
        assert_eq!(replies[0], replies[1]);
    }
    assert_eq!(
        digest(&mut con, "all:a:user"),
        digest(&mut con, "all:b:user")
    );
    assert_eq!(digest(&mut con, "all:a:ip"), digest(&mut con, "all:b:ip"));
    let error = q_err(
        &mut con,
        &argv!["RL.ALL", 2, "all:c:1", "all:c:2", "POLICY", "nope", "WINDOW", 3, "1h"],
    );
    assert!(
        error.contains("no policy named 'nope' on this node (limiter 1)"),
        "{error}"
    );
    let error = q_err(
        &mut con,
        &argv!["RL.ALL", 2, "all:c:1", "all:c:2", "POLICY"],
    );
    assert!(
        error.contains("limiter 1 (POLICY) lacks arguments"),
        "{error}"
    );
    assert!(!exists(&mut con, "all:c:1"));
}

/// A policy defined with BRIEF replies BRIEF to `RL.LIMIT key policy`: the
/// same decision as the full form, kept through a reload; PARTIAL is refused
/// with it; RL.ALL keeps its own reply form.
#[test]
fn a_brief_policy_replies_one_integer() {
    let mut server = Server::start();
    let mut con = server.conn();
    set(&mut con, "brief", &["WINDOW", "2", "1h", "BRIEF"]);
    set(&mut con, "full", &["WINDOW", "2", "1h"]);
    assert_eq!(
        get(&mut con, "brief").unwrap(),
        ["WINDOW", "2", "1h", "BRIEF"]
    );
    for key in ["b:1", "f:1"] {
        let policy = if key.starts_with('b') {
            "brief"
        } else {
            "full"
        };
        for _ in 0..2 {
            q(&mut con, &argv!["RL.LIMIT", key, policy]);
        }
    }
    let denied_full = rl(&mut con, &argv!["RL.LIMIT", "f:1", "full"]);
    let denied_brief = int(&q(&mut con, &argv!["RL.LIMIT", "b:1", "brief"]));
    assert!(!denied_full.allowed);
    // BRIEF's integer is the retry wait in ms (the same window, so within the
    // milliseconds between the two calls).
    assert!(
        (denied_brief - denied_full.retry_after).abs() < 1_000 && denied_brief > 0,
        "{denied_brief} vs {denied_full:?}"
    );
    assert_eq!(digest(&mut con, "b:1").len(), digest(&mut con, "f:1").len());
    assert_eq!(
        int(&q(&mut con, &argv!["RL.LIMIT", "b:2", "brief", "BRIEF"])),
        0
    );
    let e = q_err(&mut con, &argv!["RL.LIMIT", "b:3", "brief", "PARTIAL"]);
    assert!(e.starts_with("ERR PARTIAL") && e.contains("BRIEF"), "{e}");
    assert!(
        !exists(&mut con, "b:3"),
        "a refused RL.LIMIT writes nothing"
    );
    let all = q(&mut con, &argv!["RL.ALL", 1, "b:4", "POLICY", "brief"]);
    assert_eq!(array(&all).len(), 3, "RL.ALL keeps its own reply: {all:?}");
    let e = q_err(
        &mut con,
        &argv!["RL.POLICY.SET", "p", "WINDOW", 5, "1s", "BRIEF", "BRIEF"],
    );
    assert!(e.contains("unexpected 'BRIEF'"), "{e}");

    q(&mut con, &argv!["DEBUG", "RELOAD"]);
    assert_eq!(
        get(&mut con, "brief").unwrap(),
        ["WINDOW", "2", "1h", "BRIEF"]
    );
    assert_eq!(int(&q(&mut con, &argv!["RL.LIMIT", "b:5", "brief"])), 0);
    server.assert_alive();
}
