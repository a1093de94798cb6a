//! RL.ALL: one request against several limiters, all or nothing, on a real
//! server: atomic under concurrency, the overall retry time, peeks, bad
//! input, replication, WATCH and ACL key patterns. (CROSSSLOT in a cluster:
//! tests/cluster_routing.rs.)

mod common;

use common::*;
use redis::{Connection, Value};
use std::thread::sleep;
use std::time::Duration;

/// RL.ALL's reply: (allowed, retry_after_ms, each limiter's five fields).
#[derive(Debug)]
struct AllReply {
    allowed: bool,
    retry_after: i64,
    limiters: Vec<Reply>,
}

fn parse_all(v: &Value) -> AllReply {
    match v {
        Value::Array(items) => {
            assert_eq!(items.len(), 3, "{v:?}");
            AllReply {
                allowed: int(&items[0]) == 1,
                retry_after: int(&items[1]),
                limiters: array(&items[2]).iter().map(Reply::parse).collect(),
            }
        }
        Value::Map(pairs) => {
            let get = |name: &str| {
                &pairs
                    .iter()
                    .find(|(k, _)| string(k) == name)
                    .unwrap_or_else(|| panic!("no {name} in {v:?}"))
                    .1
            };
            assert_eq!(pairs.len(), 3, "{v:?}");
            AllReply {
                allowed: int(get("allowed")) == 1,
                retry_after: int(get("retry_after_ms")),
                limiters: array(get("limiters")).iter().map(Reply::parse).collect(),
            }
        }
        _ => panic!("not an RL.ALL reply: {v:?}"),
    }
}

fn all(con: &mut Connection, argv: &[String]) -> AllReply {
    parse_all(&q(con, argv))
}

/// Per second, per day and per IP, as in the README.
fn policy(user: &str, ip: &str, extra: &[&str]) -> Vec<String> {
    let mut cmd = argv![
        "RL.ALL",
        3,
        format!("rl:{{{user}}}:s"),
        format!("rl:{{{user}}}:d"),
        format!("rl:{{{user}}}:ip:{ip}"),
        "TOKENBUCKET",
        3,
        1,
        "1h",
        "WINDOW",
        5,
        "1d",
        "SLIDINGLOG",
        4,
        "1h"
    ];
    cmd.extend(extra.iter().map(|s| s.to_string()));
    cmd
}

#[test]
fn a_denied_call_consumes_from_none() {
    let server = Server::start();
    let mut con = server.conn();
    avoid_boundary(&mut con, 86_400_000, 60_000);
    for expected in [2, 1, 0] {
        let r = all(&mut con, &policy("u1", "a", &[]));
        assert!(r.allowed && r.retry_after == 0, "{r:?}");
        let remaining: Vec<i64> = r.limiters.iter().map(|l| l.remaining).collect();
        assert_eq!(remaining, vec![expected, expected + 2, expected + 1]);
    }
    // The bucket is empty: the day window and the IP log must not move.
    let day = key_state(&mut con, "rl:{u1}:d");
    let ip = key_state(&mut con, "rl:{u1}:ip:a");
    let bucket = key_state(&mut con, "rl:{u1}:s");
    let r = all(&mut con, &policy("u1", "a", &[]));
    assert!(!r.allowed, "{r:?}");
    assert!(!r.limiters[0].allowed);
    // The others would have allowed it and report what is really left.
    assert_eq!((r.limiters[1].allowed, r.limiters[1].remaining), (true, 2));
    assert_eq!((r.limiters[2].allowed, r.limiters[2].remaining), (true, 1));
    assert_eq!(r.retry_after, r.limiters[0].retry_after);
    assert_eq!(key_state(&mut con, "rl:{u1}:d"), day);
    assert_eq!(key_state(&mut con, "rl:{u1}:ip:a"), ip);
    assert_eq!(key_state(&mut con, "rl:{u1}:s"), bucket);
    // COST beyond one limiter's limit: never.
    let r = all(&mut con, &policy("u2", "b", &["COST", "5"]));
    assert!(!r.allowed && r.retry_after == -1, "{r:?}");
    assert!(!exists(&mut con, "rl:{u2}:d"));
}

/// After the overall retry_after_ms, with no other traffic, the same call
/// passes: the longest of the limiters' waits.
#[test]
fn overall_retry_after_is_the_longest_wait() {
    let server = Server::start();
    let mut con = server.conn();
    let cmd = argv![
        "RL.ALL",
        2,
        "{r}a",
        "{r}b",
        "GCRA",
        1,
        1,
        "300ms",
        "TOKENBUCKET",
        1,
        1,
        "150ms"
    ];
    assert!(all(&mut con, &cmd).allowed);
    let r = all(&mut con, &cmd);
    assert!(!r.allowed);
    let longest = r.limiters.iter().map(|l| l.retry_after).max().unwrap();
    assert_eq!(r.retry_after, longest, "{r:?}");
    assert!(r.retry_after > 150 && r.retry_after <= 300, "{r:?}");
    sleep(Duration::from_millis(r.retry_after as u64 + 2));
    assert!(all(&mut con, &cmd).allowed);
}

/// Twice the smallest limit in parallel: exactly that many calls pass, and
/// every limiter consumed exactly that many (never a denied call's share).
#[test]
fn all_or_nothing_under_concurrency() {
    let server = Server::start();
    let mut con = server.conn();
    avoid_boundary(&mut con, ONE_HOUR_MS, 120_000);
    let threads = 16;
    let per_thread = 10;
    let allowed_total: usize = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let server = &server;
                s.spawn(move || {
                    let mut con = server.conn();
                    let cmd = argv![
                        "RL.ALL",
                        4,
                        "{c}tb",
                        "{c}w",
                        "{c}sl",
                        "{c}g",
                        "TOKENBUCKET",
                        200,
                        1,
                        "1h",
                        "WINDOW",
                        80,
                        "1h",
                        "SLIDING",
                        "SLIDINGLOG",
                        150,
                        "1h",
                        "GCRA",
                        300,
                        1,
                        "1h"
                    ];
                    (0..per_thread)
                        .filter(|_| all(&mut con, &cmd).allowed)
                        .count()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(allowed_total, 80, "the window's limit, exactly");
    let peek = |con: &mut Connection, key: &str| Reply::parse(&q(con, &argv!["RL.PEEK", key]));
    assert_eq!(peek(&mut con, "{c}tb").remaining, 120);
    assert_eq!(peek(&mut con, "{c}w").remaining, 0);
    assert_eq!(peek(&mut con, "{c}sl").remaining, 70);
    assert_eq!(peek(&mut con, "{c}g").remaining, 220);
}

#[test]
fn peeks_and_dry_runs_write_nothing() {
    let (primary, _replica) = primary_and_replica(&[]);
    let mut con = primary.conn();
    all(&mut con, &policy("p", "x", &["COST", "2"]));
    let keys = ["rl:{p}:s", "rl:{p}:d", "rl:{p}:ip:x"];
    let before: Vec<KeyState> = keys.iter().map(|k| key_state(&mut con, k)).collect();
    let offset = repl_offset(&mut con);
    let peek = all(&mut con, &policy("p", "x", &["COST", "0"]));
    assert!(peek.allowed);
    assert_eq!(
        peek.limiters
            .iter()
            .map(|l| l.remaining)
            .collect::<Vec<_>>(),
        vec![1, 3, 2]
    );
    let dry = all(&mut con, &policy("p", "x", &["DRYRUN"]));
    assert_eq!(
        dry.limiters.iter().map(|l| l.remaining).collect::<Vec<_>>(),
        vec![0, 2, 1]
    );
    let dry = all(&mut con, &policy("p", "x", &["DRYRUN", "COST", "2"]));
    assert!(!dry.allowed);
    all(&mut con, &policy("fresh", "y", &["DRYRUN"]));
    let after: Vec<KeyState> = keys.iter().map(|k| key_state(&mut con, k)).collect();
    assert_eq!(after, before);
    assert_eq!(
        repl_offset(&mut con),
        offset,
        "a peek or dry run propagated"
    );
    assert!(!exists(&mut con, "rl:{fresh}:d"));
}

#[test]
fn resp3_reply_is_a_map_with_one_map_per_limiter() {
    let server = Server::start();
    let mut con = server.conn_resp3();
    let v = q(&mut con, &policy("m", "z", &[]));
    let Value::Map(pairs) = &v else {
        panic!("not a map: {v:?}")
    };
    let names: Vec<String> = pairs.iter().map(|(k, _)| string(k)).collect();
    assert_eq!(names, vec!["allowed", "retry_after_ms", "limiters"]);
    let r = parse_all(&v);
    assert_eq!(r.limiters.len(), 3);
    assert!(matches!(array(&pairs[2].1)[0], Value::Map(_)));
}

/// A denial leaves every key as it is: another client's WATCH holds.
#[test]
fn denials_do_not_abort_watch() {
    let server = Server::start();
    let mut con = server.conn();
    let mut other = server.conn();
    let cmd = argv!["RL.ALL", 2, "{w}a", "{w}b", "WINDOW", 1, "1h", "WINDOW", 5, "1h"];
    avoid_boundary(&mut con, ONE_HOUR_MS, 60_000);
    assert!(all(&mut con, &cmd).allowed);
    q(&mut other, &argv!["WATCH", "{w}a", "{w}b"]);
    q(&mut other, &argv!["MULTI"]);
    q(&mut other, &argv!["PING"]);
    assert!(!all(&mut con, &cmd).allowed);
    assert!(
        matches!(q(&mut other, &argv!["EXEC"]), Value::Array(_)),
        "a denied RL.ALL aborted a WATCH"
    );
    q(&mut other, &argv!["WATCH", "{w}b"]);
    q(&mut other, &argv!["MULTI"]);
    q(&mut other, &argv!["PING"]);
    all(&mut con, &argv!["RL.ALL", 1, "{w}b", "WINDOW", 5, "1h"]);
    assert_eq!(
        q(&mut other, &argv!["EXEC"]),
        Value::Nil,
        "an allowed RL.ALL must abort a WATCH on its keys"
    );
}

#[test]
fn acl_key_patterns_apply_to_every_key() {
    let server = Server::start();
    let mut admin = server.conn();
    q(
        &mut admin,
        &argv!["ACL", "SETUSER", "app", "on", ">pw", "~rl:*", "+@ratelimit"],
    );
    let mut app = server.conn_as("app", "pw");
    let ok = argv!["RL.ALL", 2, "rl:a", "rl:b", "WINDOW", 5, "1h", "GCRA", 5, 1, "1h"];
    assert!(all(&mut app, &ok).allowed);
    let e = q_err(
        &mut app,
        &argv!["RL.ALL", 2, "rl:a", "other", "WINDOW", 5, "1h", "GCRA", 5, 1, "1h"],
    );
    assert!(e.starts_with("NOPERM"), "{e}");
    assert!(!exists(&mut admin, "other"));
}

/// Bad input: an error naming the argument and the limiter; nothing written
/// on any key, nothing propagated.
#[test]
fn bad_input_changes_nothing() {
    let (primary, _replica) = primary_and_replica(&[]);
    let mut con = primary.conn();
    all(
        &mut con,
        &argv!["RL.ALL", 2, "{b}a", "{b}b", "WINDOW", 5, "1h", "GCRA", 5, 1, "1h"],
    );
    q(&mut con, &argv!["SET", "{b}s", "x"]);
    let w = |extra: &[&str]| {
        let mut cmd = argv!["RL.ALL", 2, "{b}a", "{b}b"];
        cmd.extend(extra.iter().map(|s| s.to_string()));
        cmd
    };
    let cases: Vec<(Vec<String>, &str)> = vec![
        (argv!["RL.ALL", 0, "{b}a", "WINDOW", 5, "1h"], "ERR numkeys must be an integer from 1 to 16"),
        (argv!["RL.ALL", "x", "{b}a", "WINDOW", 5, "1h"], "ERR numkeys must be"),
        (argv!["RL.ALL", 17, "{b}a", "WINDOW", 5, "1h"], "ERR numkeys must be"),
        (argv!["RL.ALL", 5, "{b}a", "{b}b", "WINDOW", 5], "ERR numkeys is 5 but only 4 keys follow"),
        (w(&["WINDOW", "5", "1h"]), "ERR limiter 2 must start with TOKENBUCKET, WINDOW, SLIDINGLOG, GCRA or POLICY, not the end"),
        (w(&["WINDOW", "5", "1h", "COST", "1"]), "ERR limiter 2 must start with"),
        (w(&["WINDOW", "5", "1h", "GCRA", "5", "1", "1h", "WINDOW", "1", "1h"]), "ERR more limiters than keys"),
        (w(&["WINDOW", "0", "1h", "GCRA", "5", "1", "1h"]), "ERR limit of limiter 1 must be an integer"),
        (w(&["WINDOW", "5", "1h", "GCRA", "5", "1", "0"]), "ERR period of limiter 2 must be a duration"),
        (w(&["WINDOW", "5", "1h", "TOKENBUCKET", "5", "1"]), "ERR limiter 2 (TOKENBUCKET) lacks arguments"),
        (w(&["WINDOW", "5", "1h", "GCRA", "5", "1", "1h", "COST", "-1"]), "ERR COST must be"),
        (w(&["WINDOW", "5", "1h", "GCRA", "5", "1", "1h", "FOO"]), "ERR unknown option 'FOO'"),
        (w(&["WINDOW", "5", "1h", "SLIDING", "SLIDING", "GCRA", "5", "1", "1h"]), "ERR limiter 2 must start with"),
        (w(&["WINDOW", "5", "1h", "WINDOW", "5", "1h"]), "WRONGTYPE key '{b}b' holds a GCRA limiter (RL.GCRA, RL.THROTTLE, CL.THROTTLE), not a fixed window (RL.WINDOW)"),
        (argv!["RL.ALL", 2, "{b}a", "{b}a", "WINDOW", 5, "1h", "WINDOW", 5, "1h"], "ERR key '{b}a' is given more than once"),
        (argv!["RL.ALL", 2, "{b}a", "{b}s", "WINDOW", 5, "1h", "WINDOW", 5, "1h"], "WRONGTYPE key '{b}s' holds the wrong kind of value"),
        (argv!["RL.ALL", 1, "{b}a"], "ERR wrong number of arguments for 'rl.all' command"),
    ];
    let keys = ["{b}a", "{b}b", "{b}s"];
    for (cmd, prefix) in &cases {
        let before: Vec<KeyState> = keys.iter().map(|k| key_state(&mut con, k)).collect();
        let offset = repl_offset(&mut con);
        let e = q_err(&mut con, cmd);
        assert!(
            e.starts_with(prefix),
            "{cmd:?}\n  expected {prefix}\n  got {e}"
        );
        let after: Vec<KeyState> = keys.iter().map(|k| key_state(&mut con, k)).collect();
        assert_eq!(after, before, "{cmd:?} changed a key");
        assert_eq!(repl_offset(&mut con), offset, "{cmd:?} propagated");
    }
}

/// Random RL.ALL traffic over mixed limiters: the replica ends with the
/// primary's exact state (digests, expiries), and so does a reload.
#[test]
fn replica_and_reload_hold_the_same_state() {
    let (primary, replica) = primary_and_replica(&[]);
    let mut con = primary.conn();
    let mut next = xorshift(0x2545_f491_u64);
    let keys: Vec<String> = (0..6).map(|i| format!("{{r}}k{i}")).collect();
    let specs = |i: usize| -> Vec<String> {
        match i % 5 {
            0 => argv!["TOKENBUCKET", 6, 1, "1h"],
            1 => argv!["WINDOW", 7, "1h"],
            2 => argv!["WINDOW", 8, "1h", "SLIDING"],
            3 => argv!["SLIDINGLOG", 5, "1h", "COUNTDENIED"],
            _ => argv!["GCRA", 9, 1, "1h"],
        }
    };
    avoid_boundary(&mut con, ONE_HOUR_MS, 60_000);
    for _ in 0..400 {
        let a = (next() % 6) as usize;
        let b = (a + 1 + (next() % 5) as usize) % 6;
        let mut cmd = argv!["RL.ALL", 2, &keys[a], &keys[b]];
        cmd.extend(specs(a));
        cmd.extend(specs(b));
        cmd.extend(argv!["COST", next() % 3]);
        all(&mut con, &cmd);
    }
    sync_replica(&primary, &replica);
    let mut rcon = replica.conn();
    let states = digests_and_expiries(&mut con, &keys);
    let on_replica = digests_and_expiries(&mut rcon, &keys);
    for ((key, state), replicated) in keys.iter().zip(&states).zip(&on_replica) {
        assert_eq!(replicated, state, "{key}");
    }
    q(&mut con, &argv!["DEBUG", "RELOAD"]);
    assert_eq!(
        digests_and_expiries(&mut con, &keys),
        states,
        "after DEBUG RELOAD"
    );
}
