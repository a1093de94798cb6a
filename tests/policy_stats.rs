//! Per-policy counters against a real server: RL.LIMIT and RL.ALL's
//! `POLICY name` each count where they apply, shadow mode and lockouts,
//! dry runs not at all; a waiting call counts when answered; a redefinition,
//! a reset and a restart start at zero; RL.POLICY.STATS in RESP2 and RESP3,
//! and INFO.

mod common;

use common::*;
use redis::{Connection, Value};
use std::thread;
use std::time::Duration;

/// (allowed, denied, shadow_denied, lockouts) of `name`.
fn stats(con: &mut Connection, name: &str) -> (i64, i64, i64, i64) {
    let reply = array(&q(con, &argv!["RL.POLICY.STATS", name])).to_vec();
    assert_eq!(string(&reply[0]), name);
    let s = array(&reply[1]).to_vec();
    (int(&s[0]), int(&s[1]), int(&s[2]), int(&s[3]))
}

#[test]
fn calls_count_where_their_policy_applies() {
    let server = Server::start();
    let mut con = server.conn();
    q(&mut con, &argv!["RL.POLICY.SET", "api", "WINDOW", 2, "1h"]);
    q(
        &mut con,
        &argv!["RL.POLICY.SET", "burst", "TOKENBUCKET", 1, 1, "1h"],
    );
    for _ in 0..3 {
        q(&mut con, &argv!["RL.LIMIT", "k", "api"]);
    }
    q(&mut con, &argv!["RL.LIMIT", "k", "api", "LOCKOUT", "1m"]);
    q(&mut con, &argv!["RL.LIMIT", "k", "api", "DRYRUN"]);
    q(&mut con, &argv!["RL.LIMIT", "k", "api", "COST", 0]);
    assert_eq!(stats(&mut con, "api"), (2, 2, 0, 1));
    // RL.ALL: allowed counts for every policy when the call is allowed;
    // denied only for the policy whose limiter denied it.
    let all = argv!["RL.ALL", 2, "{u}a", "{u}b", "POLICY", "api", "POLICY", "burst"];
    q(&mut con, &all);
    q(&mut con, &all);
    assert_eq!(stats(&mut con, "api"), (3, 2, 0, 1));
    assert_eq!(stats(&mut con, "burst"), (1, 1, 0, 0));
    // Shadow mode: answered allowed, counted as would-be denials.
    q(
        &mut con,
        &argv!["CONFIG", "SET", "ratelimit.shadow-mode", "yes"],
    );
    q(&mut con, &argv!["RL.LIMIT", "k2", "api", "COST", 5]);
    q(
        &mut con,
        &argv!["CONFIG", "SET", "ratelimit.shadow-mode", "no"],
    );
    assert_eq!(stats(&mut con, "api"), (4, 2, 1, 1));
    // A name that is no policy is nil; no names: all, sorted.
    let reply = array(&q(&mut con, &argv!["RL.POLICY.STATS", "nope"])).to_vec();
    assert_eq!(reply[1], Value::Nil);
    let reply = array(&q(&mut con, &argv!["RL.POLICY.STATS"])).to_vec();
    let names: Vec<String> = reply.iter().step_by(2).map(string).collect();
    assert_eq!(names, ["api", "burst"]);
    // INFO lists each policy whose name fits a field.
    let info = info(&mut con, "ratelimit_policies");
    assert!(
        info.contains(
            "ratelimit_policy_api:allowed=4,denied=2,shadow_denied=1,lockouts=1,since_ms="
        ),
        "{info}"
    );
    let mut resp3 = server.conn_resp3();
    match q(&mut resp3, &argv!["RL.POLICY.STATS", "burst"]) {
        Value::Map(entries) => match &entries[0].1 {
            Value::Map(fields) => {
                let names: Vec<String> = fields.iter().map(|(k, _)| string(k)).collect();
                assert_eq!(
                    names,
                    ["allowed", "denied", "shadow_denied", "lockouts", "since_ms"]
                );
            }
            other => panic!("{other:?}"),
        },
        other => panic!("RESP3 reply is not a map: {other:?}"),
    }
}

#[test]
fn redefinition_reset_and_restart_start_at_zero() {
    let mut server = Server::start();
    let mut con = server.conn();
    q(&mut con, &argv!["RL.POLICY.SET", "api", "WINDOW", 1, "1h"]);
    q(&mut con, &argv!["RL.LIMIT", "a", "api"]);
    q(&mut con, &argv!["RL.LIMIT", "a", "api"]);
    assert_eq!(stats(&mut con, "api"), (1, 1, 0, 0));
    assert_eq!(
        int(&q(&mut con, &argv!["RL.POLICY.RESETSTATS", "api", "nope"])),
        1
    );
    assert_eq!(stats(&mut con, "api"), (0, 0, 0, 0));
    q(&mut con, &argv!["RL.LIMIT", "b", "api"]);
    q(&mut con, &argv!["RL.POLICY.SET", "api", "WINDOW", 5, "1h"]);
    assert_eq!(
        stats(&mut con, "api"),
        (0, 0, 0, 0),
        "a new definition counts anew"
    );
    q(&mut con, &argv!["RL.LIMIT", "b", "api"]);
    server.restart(Shutdown::Save);
    let mut con = server.conn();
    assert_eq!(
        stats(&mut con, "api"),
        (0, 0, 0, 0),
        "counters live in memory"
    );
    q(&mut con, &argv!["RL.POLICY.DEL", "api"]);
    let reply = array(&q(&mut con, &argv!["RL.POLICY.STATS"])).to_vec();
    assert!(reply.is_empty());
}

#[test]
fn a_waiting_call_counts_when_answered() {
    let server = Server::start();
    let mut con = server.conn();
    q(
        &mut con,
        // Long enough that the waiter waits also under valgrind (make memcheck).
        &argv!["RL.POLICY.SET", "slow", "TOKENBUCKET", 1, 1, "2s"],
    );
    q(&mut con, &argv!["RL.LIMIT", "w", "slow"]);
    let mut waiter = server.conn();
    let handle =
        thread::spawn(move || q(&mut waiter, &argv!["RL.LIMIT", "w", "slow", "BLOCK", "10s"]));
    until_waiting(&mut con, 1);
    assert_eq!(
        stats(&mut con, "slow"),
        (1, 0, 0, 0),
        "not counted while it waits"
    );
    let reply = handle.join().unwrap();
    assert_eq!(int(&array(&reply)[0]), 1);
    thread::sleep(Duration::from_millis(20));
    assert_eq!(stats(&mut con, "slow"), (2, 0, 0, 0));
}
