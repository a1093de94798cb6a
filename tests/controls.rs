//! Operators' controls: the `ratelimit.*` module configs, keyspace events on
//! denials and lockouts, shadow mode, COMMAND DOCS and the INFO counters of
//! refunds, unlocks and lockouts.

mod common;

use std::time::Duration;

use common::*;
use redis::Value;

/// Turns on module keyspace events and returns a connection to subscribe
/// on (a `PubSub` unsubscribes when dropped, so the caller holds it).
fn subscriber(server: &Server) -> redis::Connection {
    let mut con = server.conn();
    q(
        &mut con,
        &argv!["CONFIG", "SET", "notify-keyspace-events", "Kd"],
    );
    let sub = server.conn();
    sub.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    sub
}

fn subscribe(con: &mut redis::Connection) -> redis::PubSub<'_> {
    let mut sub = con.as_pubsub();
    sub.psubscribe("__keyspace@0__:*").unwrap();
    sub
}

/// The next keyspace event: (key, event name).
fn next_event(sub: &mut redis::PubSub) -> (String, String) {
    let message = sub.get_message().expect("a keyspace event");
    let channel = message.get_channel_name().to_string();
    let key = channel.trim_start_matches("__keyspace@0__:").to_string();
    (key, message.get_payload::<String>().unwrap())
}

fn event(key: &str, name: &str) -> (String, String) {
    (key.to_string(), name.to_string())
}

fn counter(con: &mut redis::Connection, name: &str) -> i64 {
    let text = info(con, "ratelimit");
    field(&text, &format!("ratelimit_{name}"))
        .unwrap_or_else(|| panic!("INFO has no ratelimit_{name}:\n{text}"))
        .parse()
        .unwrap()
}

fn set(con: &mut redis::Connection, name: &str, value: &str) {
    q(con, &argv!["CONFIG", "SET", name, value]);
}

#[test]
fn denial_and_lockout_events_are_opt_in() {
    let server = Server::start();
    let mut con = server.conn();
    let mut sub_con = subscriber(&server);
    let mut sub = subscribe(&mut sub_con);
    // Off by default: these denials emit nothing (the first event seen below
    // is the one after the switch).
    rl(&mut con, &argv!["RL.WINDOW", "a", 1, "1h"]);
    assert!(!rl(&mut con, &argv!["RL.WINDOW", "a", 1, "1h"]).allowed);
    set(&mut con, "ratelimit.events", "yes");
    // A dry run is a question, not traffic: no event.
    assert!(!rl(&mut con, &argv!["RL.WINDOW", "a", 1, "1h", "DRYRUN"]).allowed);
    assert!(!rl(&mut con, &argv!["RL.WINDOW", "a", 1, "1h"]).allowed);
    assert_eq!(next_event(&mut sub), event("a", "ratelimit.denied"));

    // Every algorithm and command; allowed requests and peeks emit nothing.
    for algo in Algo::ALL {
        let key = format!("algo:{}", algo.name());
        assert!(rl(&mut con, &algo.cmd(&key, 1, "1h")).allowed);
        rl(&mut con, &algo.cmd_with(&key, 1, "1h", &["COST", "0"]));
        assert!(!rl(&mut con, &algo.cmd(&key, 1, "1h")).allowed);
        assert_eq!(next_event(&mut sub), event(&key, "ratelimit.denied"));
    }
    q(&mut con, &argv!["CL.THROTTLE", "cell", 0, 1, 60]);
    q(&mut con, &argv!["CL.THROTTLE", "cell", 0, 1, 60]);
    assert_eq!(next_event(&mut sub), event("cell", "ratelimit.denied"));

    // A lockout: the denial, then the lock; a request under the lock is a denial.
    let lock = argv!["RL.WINDOW", "login", 1, "1h", "LOCKOUT", "1m"];
    rl(&mut con, &lock);
    assert!(!rl(&mut con, &lock).allowed);
    assert_eq!(next_event(&mut sub), event("login", "ratelimit.denied"));
    assert_eq!(next_event(&mut sub), event("login", "ratelimit.locked"));
    assert!(!rl(&mut con, &lock).allowed);
    assert_eq!(next_event(&mut sub), event("login", "ratelimit.denied"));

    // RL.ALL: an event for the limiter that denied, none for the one that
    // allowed (the sentinel's event comes next).
    let all = argv!["RL.ALL", 2, "{x}1", "{x}2", "WINDOW", 1, "1h", "WINDOW", 5, "1h"];
    q(&mut con, &all);
    q(&mut con, &all);
    assert_eq!(next_event(&mut sub), event("{x}1", "ratelimit.denied"));
    rl(&mut con, &argv!["RL.WINDOW", "sentinel", 1, "1h"]);
    rl(&mut con, &argv!["RL.WINDOW", "sentinel", 1, "1h"]);
    assert_eq!(next_event(&mut sub), event("sentinel", "ratelimit.denied"));

    // Switched off again: nothing.
    set(&mut con, "ratelimit.events", "no");
    rl(&mut con, &argv!["RL.WINDOW", "a", 1, "1h"]);
    set(&mut con, "ratelimit.events", "yes");
    rl(&mut con, &argv!["RL.WINDOW", "sentinel", 1, "1h"]);
    assert_eq!(next_event(&mut sub), event("sentinel", "ratelimit.denied"));
}

#[test]
fn shadow_mode_answers_allowed_and_counts_what_it_would_deny() {
    let server = Server::start();
    let mut con = server.conn();
    avoid_boundary(&mut con, ONE_HOUR_MS, 60_000);
    set(&mut con, "ratelimit.shadow-mode", "yes");
    let mut sub_con = subscriber(&server);
    let mut sub = subscribe(&mut sub_con);
    set(&mut con, "ratelimit.events", "yes");
    for algo in Algo::ALL {
        let key = format!("shadow:{}", algo.name());
        let shadowed = counter(&mut con, "shadow_denied");
        for i in 0..6 {
            let reply = rl(&mut con, &algo.cmd(&key, 3, "1h"));
            assert!(reply.allowed, "{key} call {i}: {reply:?}");
            assert_eq!(reply.retry_after, 0, "{key} call {i}");
            // The counts are the limiter's own: it admitted three.
            assert_eq!(reply.remaining, (2 - i).max(0), "{key} call {i}");
        }
        assert_eq!(counter(&mut con, "shadow_denied"), shadowed + 3, "{key}");
        assert_eq!(next_event(&mut sub), event(&key, "ratelimit.shadow-denied"));
        for _ in 0..2 {
            next_event(&mut sub);
        }
        // A dry run answers what the call would: allowed, and not counted.
        assert!(rl(&mut con, &algo.cmd_with(&key, 3, "1h", &["DRYRUN"])).allowed);
        assert_eq!(counter(&mut con, "shadow_denied"), shadowed + 3, "{key}");
    }
    // PARTIAL: the whole request passes.
    let partial = argv![
        "RL.TOKENBUCKET",
        "shadow:token bucket",
        3,
        1,
        "1h",
        "COST",
        2,
        "PARTIAL"
    ];
    let reply = q(&mut con, &partial);
    assert_eq!(int(&array(&reply)[0]), 1);
    assert_eq!(int(&array(&reply)[5]), 2, "granted");
    // redis-cell's reply: not limited, retry -1.
    q(&mut con, &argv!["CL.THROTTLE", "cell", 0, 1, 60]);
    let reply: Vec<i64> = array(&q(&mut con, &argv!["CL.THROTTLE", "cell", 0, 1, 60]))
        .iter()
        .map(int)
        .collect();
    assert_eq!((reply[0], reply[2], reply[3]), (0, 0, -1));
    // RL.ALL: allowed, and the limiter that allowed is untouched, as when enforced.
    let all = argv!["RL.ALL", 2, "{y}full", "{y}free", "WINDOW", 1, "1h", "WINDOW", 5, "1h"];
    q(&mut con, &all);
    let reply = q(&mut con, &all);
    assert_eq!(int(&array(&reply)[0]), 1);
    assert_eq!(int(&array(&reply)[1]), 0);
    let free = Reply::parse(&q(&mut con, &argv!["RL.PEEK", "{y}free"]));
    assert_eq!(
        free.remaining, 4,
        "the denied call consumed from the other limiter"
    );

    // Shadow mode off: enforcement takes over from the same state; the
    // limiter took what it admitted, not every call it answered allowed.
    set(&mut con, "ratelimit.shadow-mode", "no");
    for algo in Algo::ALL {
        let key = format!("shadow:{}", algo.name());
        assert!(!rl(&mut con, &algo.cmd(&key, 3, "1h")).allowed, "{key}");
    }
    let refund = q(&mut con, &argv!["RL.REFUND", "shadow:fixed window", 3]);
    assert_eq!(int(&array(&refund)[5]), 3, "the window counted 3, not 6");
    assert_eq!(counter(&mut con, "window_denied"), 1);
}

#[test]
fn configs_are_validated_and_kept_by_config_rewrite() {
    let dir = TempDir::new("valkey-rl-conf");
    let conf = dir.path.join("valkey.conf");
    std::fs::write(&conf, "").unwrap();
    let conf_arg = conf.display().to_string();
    let mut server = Server::start_with_first(&[&conf_arg], &[]);
    let mut con = server.conn();
    let get = |con: &mut redis::Connection, name: &str| {
        string(&array(&q(con, &argv!["CONFIG", "GET", name]))[1])
    };
    assert_eq!(get(&mut con, "ratelimit.events"), "no");
    assert_eq!(get(&mut con, "ratelimit.shadow-mode"), "no");
    assert_eq!(get(&mut con, "ratelimit.max-limiters"), "16");
    for (name, value) in [
        ("ratelimit.max-limiters", "0"),
        ("ratelimit.max-limiters", "1025"),
        ("ratelimit.max-limiters", "many"),
        ("ratelimit.events", "maybe"),
        ("ratelimit.shadow-mode", "2"),
    ] {
        let error = q_err(&mut con, &argv!["CONFIG", "SET", name, value]);
        assert!(error.starts_with("ERR"), "{name} {value}: {error}");
    }
    assert_eq!(get(&mut con, "ratelimit.max-limiters"), "16");

    let keys = |n: usize| -> Vec<String> {
        let mut cmd = argv!["RL.ALL", n];
        cmd.extend((0..n).map(|i| format!("{{m}}{i}")));
        for _ in 0..n {
            cmd.extend(argv!["WINDOW", 5, "1h"]);
        }
        cmd
    };
    set(&mut con, "ratelimit.max-limiters", "2");
    let error = q_err(&mut con, &keys(3));
    assert!(error.contains("from 1 to 2"), "{error}");
    q(&mut con, &keys(2));
    set(&mut con, "ratelimit.max-limiters", "40");
    assert_eq!(int(&array(&q(&mut con, &keys(33)))[0]), 1);

    set(&mut con, "ratelimit.shadow-mode", "yes");
    set(&mut con, "ratelimit.events", "yes");
    q(&mut con, &argv!["CONFIG", "REWRITE"]);
    let written = std::fs::read_to_string(&conf).unwrap();
    for line in [
        "ratelimit.shadow-mode yes",
        "ratelimit.events yes",
        "ratelimit.max-limiters 40",
    ] {
        assert!(written.lines().any(|l| l == line), "{line} in:\n{written}");
    }
    // The rewrite also writes a loadmodule line; the harness loads the module
    // from its command line, so drop that line before starting on the file.
    let kept: Vec<&str> = written
        .lines()
        .filter(|l| !l.starts_with("loadmodule"))
        .collect();
    std::fs::write(&conf, kept.join("\n")).unwrap();
    server.restart(Shutdown::NoSave);
    let mut con = server.conn();
    assert_eq!(get(&mut con, "ratelimit.shadow-mode"), "yes");
    assert_eq!(get(&mut con, "ratelimit.events"), "yes");
    assert_eq!(get(&mut con, "ratelimit.max-limiters"), "40");
}

/// `COMMAND DOCS` arguments as (name, nested arguments) pairs.
fn doc_args(docs: &Value) -> Vec<(String, Vec<Value>)> {
    let fields = array(docs);
    let at = fields
        .iter()
        .position(|v| matches!(v, Value::BulkString(b) if b == b"arguments"));
    let Some(at) = at else { return Vec::new() };
    array(&fields[at + 1])
        .iter()
        .map(|arg| {
            let pairs = array(arg);
            let name = pairs
                .iter()
                .position(|v| matches!(v, Value::BulkString(b) if b == b"name"))
                .map(|i| string(&pairs[i + 1]))
                .unwrap_or_default();
            (name, pairs.to_vec())
        })
        .collect()
}

#[test]
fn command_docs_list_every_argument() {
    let server = Server::start();
    let mut con = server.conn();
    let names = |con: &mut redis::Connection, command: &str| -> Vec<String> {
        let docs = q(con, &argv!["COMMAND", "DOCS", command]);
        doc_args(&array(&docs)[1])
            .into_iter()
            .map(|(n, _)| n)
            .collect()
    };
    let options = ["cost", "dryrun", "partial", "duration", "brief"];
    let expected: [(&str, &[&str]); 15] = [
        (
            "rl.tokenbucket",
            &["key", "capacity", "refill_amount", "refill_period"],
        ),
        (
            "rl.window",
            &["key", "limit", "period", "zone", "anchor", "sliding"],
        ),
        ("rl.slidinglog", &["key", "limit", "period", "countdenied"]),
        ("rl.gcra", &["key", "burst", "rate", "period"]),
        ("rl.all", &["numkeys", "key", "limiter"]),
        (
            "rl.throttle",
            &["key", "max_burst", "count_per_period", "period", "quantity"],
        ),
        (
            "cl.throttle",
            &["key", "max_burst", "count_per_period", "period", "quantity"],
        ),
        ("rl.refund", &["key", "amount"]),
        ("rl.unlock", &["key"]),
        ("rl.peek", &["key"]),
        ("rl.inspect", &["key"]),
        ("rl.apply", &["data"]),
        (
            "rl.lease",
            &["key", "limit", "ttl", "cost", "dryrun", "timeout"],
        ),
        ("rl.release", &["key", "lease_id"]),
        ("rl.extend", &["key", "lease_id", "ttl"]),
    ];
    for (command, positional) in expected {
        let mut want: Vec<&str> = positional.to_vec();
        let takes_options = !positional.contains(&"quantity")
            && !command.starts_with("rl.lease")
            && !matches!(
                command,
                "rl.refund"
                    | "rl.unlock"
                    | "rl.peek"
                    | "rl.inspect"
                    | "rl.apply"
                    | "rl.release"
                    | "rl.extend"
            );
        if takes_options {
            want.extend(options);
            // Every single-limiter command waits with BLOCK; RL.ALL does not.
            if command != "rl.all" {
                want.push("timeout");
            }
        }
        assert_eq!(names(&mut con, command), want, "{command}");
    }
    // RL.ALL's limiter is one of four blocks, each with its token.
    let docs = q(&mut con, &argv!["COMMAND", "DOCS", "rl.all"]);
    let limiter = doc_args(&array(&docs)[1]).remove(2).1;
    let text = format!("{limiter:?}");
    for token in ["TOKENBUCKET", "WINDOW", "SLIDINGLOG", "GCRA", "COUNTDENIED"] {
        assert!(text.contains(token), "{token} in {text}");
    }
}

#[test]
fn info_counts_lockouts_unlocks_and_refunds() {
    let server = Server::start();
    let mut con = server.conn();
    let lock = argv!["RL.WINDOW", "login", 1, "1h", "LOCKOUT", "1m"];
    rl(&mut con, &lock);
    rl(&mut con, &lock);
    rl(&mut con, &lock);
    assert_eq!(
        counter(&mut con, "lockouts"),
        1,
        "a request under a lock does not lock again"
    );
    assert_eq!(int(&q(&mut con, &argv!["RL.UNLOCK", "login"])), 1);
    assert_eq!(int(&q(&mut con, &argv!["RL.UNLOCK", "login"])), 0);
    assert_eq!(counter(&mut con, "unlocks"), 1);
    rl(
        &mut con,
        &argv!["RL.TOKENBUCKET", "tb", 10, 1, "1h", "COST", 4],
    );
    q(&mut con, &argv!["RL.REFUND", "tb", 3]);
    q(&mut con, &argv!["RL.REFUND", "tb", 3]);
    assert_eq!(counter(&mut con, "refunds"), 2);
    assert_eq!(
        counter(&mut con, "refunded"),
        4,
        "3, then the 1 still missing"
    );
}
