//! Exact limits, reply shape (RESP2 and RESP3), options, durations, TYPE.

mod common;

use common::*;
use redis::Value;

/// N allowed with remaining N-1..0, then denied; the limit field echoes N.
#[test]
fn exact_limits_for_every_algorithm() {
    let server = Server::start();
    let mut con = server.conn();
    avoid_boundary(&mut con, ONE_HOUR_MS, 60_000);
    for algo in Algo::ALL {
        for limit in [1u64, 2, 7, 50] {
            let key = format!("exact:{algo:?}:{limit}");
            let cmd = algo.cmd(&key, limit, "1h");
            for i in 0..limit {
                let r = rl(&mut con, &cmd);
                assert!(
                    r.allowed,
                    "{} limit {limit}: request {} denied: {r:?}",
                    algo.name(),
                    i + 1
                );
                assert_eq!(r.limit, limit as i64, "{}: limit field", algo.name());
                assert_eq!(
                    r.remaining,
                    (limit - 1 - i) as i64,
                    "{}: remaining after {} requests",
                    algo.name(),
                    i + 1
                );
                assert_eq!(r.retry_after, 0);
                assert!(
                    r.reset_after > 0,
                    "{}: a used limiter is not full: {r:?}",
                    algo.name()
                );
            }
            for _ in 0..3 {
                let r = rl(&mut con, &cmd);
                assert!(
                    !r.allowed,
                    "{} limit {limit}: request {} allowed: {r:?}",
                    algo.name(),
                    limit + 1
                );
                assert_eq!(r.limit, limit as i64);
                assert_eq!(r.remaining, 0);
                assert!(
                    r.retry_after > 0,
                    "{}: denied within limit => retry_after > 0: {r:?}",
                    algo.name()
                );
                assert!(r.reset_after > 0);
            }
        }
    }
}

/// COST n takes n; a request that does not fit is denied and takes nothing.
#[test]
fn cost_counts_against_the_limit() {
    let server = Server::start();
    let mut con = server.conn();
    avoid_boundary(&mut con, ONE_HOUR_MS, 60_000);
    for algo in Algo::ALL {
        let key = format!("cost:{algo:?}");
        let cmd = |cost: u64| algo.cmd_with(&key, 10, "1h", &["COST", &cost.to_string()]);
        let r = rl(&mut con, &cmd(4));
        assert!(r.allowed && r.remaining == 6, "{}: {r:?}", algo.name());
        let r = rl(&mut con, &cmd(7));
        assert!(
            !r.allowed && r.remaining == 6 && r.retry_after > 0,
            "{}: 7 > 6 left: {r:?}",
            algo.name()
        );
        let r = rl(&mut con, &cmd(6));
        assert!(r.allowed && r.remaining == 0, "{}: {r:?}", algo.name());
        let r = rl(&mut con, &cmd(1));
        assert!(!r.allowed && r.remaining == 0, "{}: {r:?}", algo.name());
        // More than the limit can ever hold.
        let r = rl(&mut con, &cmd(11));
        assert!(
            !r.allowed && r.retry_after == -1,
            "{}: cost > limit => retry -1: {r:?}",
            algo.name()
        );
        // Also on a fresh key, and the key is not created by it.
        let fresh = format!("cost:fresh:{algo:?}");
        let r = rl(&mut con, &algo.cmd_with(&fresh, 10, "1h", &["COST", "11"]));
        assert!(
            !r.allowed && r.retry_after == -1 && r.remaining == 10,
            "{}: {r:?}",
            algo.name()
        );
        assert!(
            !exists(&mut con, &fresh),
            "{}: a denied request created the key",
            algo.name()
        );
    }
}

/// A full limiter is reported with reset_after 0 (via COST 0 on an absent key).
#[test]
fn absent_key_reads_as_full() {
    let server = Server::start();
    let mut con = server.conn();
    for algo in Algo::ALL {
        let r = rl(&mut con, &algo.cmd_with("absent", 5, "1h", &["COST", "0"]));
        assert_eq!(
            r,
            Reply {
                allowed: true,
                limit: 5,
                remaining: 5,
                retry_after: 0,
                reset_after: 0
            },
            "{}",
            algo.name()
        );
        let r = rl(&mut con, &algo.cmd_with("absent", 5, "1h", &["DRYRUN"]));
        assert!(
            r.allowed && r.remaining == 4 && r.reset_after > 0,
            "{}: {r:?}",
            algo.name()
        );
        assert!(!exists(&mut con, "absent"));
    }
}

/// Options come after the positionals in any order and any case.
#[test]
fn options_any_order_any_case() {
    let server = Server::start();
    let mut con = server.conn();
    avoid_boundary(&mut con, ONE_HOUR_MS, 60_000);
    let variants: &[&[&str]] = &[
        &["COST", "2", "DRYRUN"],
        &["DRYRUN", "COST", "2"],
        &["dryrun", "cost", "2"],
        &["DryRun", "Cost", "2"],
    ];
    for algo in Algo::ALL {
        for (i, options) in variants.iter().enumerate() {
            let key = format!("opts:{algo:?}:{i}");
            let r = rl(&mut con, &algo.cmd_with(&key, 5, "1h", options));
            assert!(
                r.allowed && r.remaining == 3,
                "{} {options:?}: {r:?}",
                algo.name()
            );
            assert!(
                !exists(&mut con, &key),
                "{} {options:?}: DRYRUN wrote the key",
                algo.name()
            );
        }
    }
    // The algorithm's own flag, in any position and case.
    let r = rl(
        &mut con,
        &argv!["RL.WINDOW", "w1", 5, "1h", "cost", 2, "sliding"],
    );
    assert!(r.allowed && r.remaining == 3);
    let r = rl(&mut con, &argv!["RL.WINDOW", "w1", 5, "1h", "Sliding"]);
    assert!(
        r.allowed && r.remaining == 2,
        "same algorithm when SLIDING is in another case: {r:?}"
    );
    let r = rl(
        &mut con,
        &argv!["RL.SLIDINGLOG", "l1", 5, "1h", "countdenied", "COST", 5],
    );
    assert!(r.allowed && r.remaining == 0);
    let r = rl(
        &mut con,
        &argv!["RL.SLIDINGLOG", "l1", 5, "1h", "COST", 1, "CountDenied"],
    );
    assert!(!r.allowed);
}

/// Durations: a bare integer is seconds; units ms, s, m, h, d, any case. A
/// one-token bucket refilling one token per period is full again exactly one
/// period after its token is taken: reset_after_ms == the period in ms.
#[test]
fn duration_units() {
    let server = Server::start();
    let mut con = server.conn();
    let cases: &[(&str, i64)] = &[
        ("1ms", 1),
        ("250ms", 250),
        ("250MS", 250),
        ("1", 1000),
        ("90", 90_000),
        ("90s", 90_000),
        ("90S", 90_000),
        ("15m", 900_000),
        ("2h", 7_200_000),
        ("2H", 7_200_000),
        ("1d", 86_400_000),
        ("3650d", 3650 * 86_400_000),
        ("315360000", 315_360_000_000),
        ("315360000000ms", 315_360_000_000),
    ];
    for (i, (text, ms)) in cases.iter().enumerate() {
        let key = format!("dur:{i}");
        let (_, items) = timed(
            &mut con,
            &[argv!["RL.TOKENBUCKET", key, 1, 1, text], argv!["PTTL", key]],
        );
        let r = Reply::parse(&items[0]);
        assert!(r.allowed && r.remaining == 0, "{text}: {r:?}");
        assert_eq!(
            r.reset_after, *ms,
            "RL.TOKENBUCKET k 1 1 {text}: reset_after_ms"
        );
        if *ms > 2 {
            let ttl = int(&items[1]);
            assert!(
                ttl <= *ms && ttl >= *ms - 2,
                "PTTL {ttl} right after RL.TOKENBUCKET k 1 1 {text} (same MULTI): expected {ms}"
            );
        }
        // The windows and the log take the same syntax.
        for (n, cmd) in [
            argv!["RL.WINDOW", format!("{key}:w"), 1, text],
            argv!["RL.SLIDINGLOG", format!("{key}:l"), 1, text],
        ]
        .into_iter()
        .enumerate()
        {
            let r = rl(&mut con, &cmd);
            assert!(r.allowed, "{cmd:?}: {r:?}");
            if n == 1 {
                assert_eq!(
                    r.reset_after, *ms,
                    "{cmd:?}: a log is empty one period after its entry"
                );
            } else {
                assert!(
                    r.reset_after <= *ms,
                    "{cmd:?}: window end within one period: {r:?}"
                );
            }
        }
    }
}

/// The extremes of every range are accepted.
#[test]
fn range_extremes_are_accepted() {
    let server = Server::start();
    let mut con = server.conn();
    let max = MAX_COUNT.to_string();
    let cmds = [
        argv!["RL.TOKENBUCKET", "tb1", &max, &max, "1ms"],
        argv!["RL.TOKENBUCKET", "tb2", &max, 1, "3650d"],
        argv!["RL.TOKENBUCKET", "tb3", 1, &max, "3650d", "COST", 0],
        argv!["RL.TOKENBUCKET", "tb4", &max, 1, "3650d", "COST", &max],
        argv!["RL.WINDOW", "w1", &max, "3650d", "COST", &max],
        argv!["RL.WINDOW", "w2", &max, "1ms", "SLIDING", "COST", &max],
        argv!["RL.SLIDINGLOG", "l1", &max, "3650d", "COST", &max],
        argv!["RL.SLIDINGLOG", "l2", 1, "1ms", "COUNTDENIED"],
    ];
    for cmd in &cmds {
        let r = rl(&mut con, cmd);
        assert!(r.allowed, "{cmd:?}: {r:?}");
        assert!(r.limit >= 1);
    }
    // A full-size request on a full max-size bucket leaves 0; one more, in the
    // same MULTI (same server time), is denied for exactly one refill period.
    let replies = exec(
        &mut con,
        &[
            argv!["RL.TOKENBUCKET", "tb5", &max, 1, "3650d", "COST", &max],
            argv!["RL.TOKENBUCKET", "tb5", &max, 1, "3650d"],
        ],
    );
    let r = Reply::parse(&replies[1]);
    assert!(!r.allowed && r.remaining == 0, "{r:?}");
    assert_eq!(
        r.retry_after, 315_360_000_000,
        "one token of 1 per 3650d: {r:?}"
    );
    for key in ["tb2", "tb4", "w1", "l1"] {
        assert_ne!(pttl(&mut con, key), -2, "{key} should exist");
    }
    let r = rl(&mut con, &argv!["RL.SLIDINGLOG", "l1", &max, "3650d"]);
    assert!(!r.allowed && r.retry_after > 0, "{r:?}");
}

/// RESP3: the reply is a map with the five names.
#[test]
fn resp3_reply_is_a_map() {
    let server = Server::start();
    let mut con = server.conn_resp3();
    avoid_boundary(&mut con, ONE_HOUR_MS, 60_000);
    for algo in Algo::ALL {
        let key = format!("resp3:{algo:?}");
        let v = q(&mut con, &algo.cmd(&key, 2, "1h"));
        let Value::Map(pairs) = &v else {
            panic!("{}: RESP3 reply should be a map: {v:?}", algo.name());
        };
        let names: Vec<String> = pairs.iter().map(|(k, _)| string(k)).collect();
        let mut sorted = names.clone();
        sorted.sort();
        let mut expected: Vec<String> = FIELDS.iter().map(|s| s.to_string()).collect();
        expected.sort();
        assert_eq!(sorted, expected, "{}: map keys", algo.name());
        let r = Reply::parse(&v);
        assert!(r.allowed && r.limit == 2 && r.remaining == 1);
        rl(&mut con, &algo.cmd(&key, 2, "1h"));
        let r = Reply::parse(&q(&mut con, &algo.cmd(&key, 2, "1h")));
        assert!(!r.allowed && r.retry_after > 0 && r.remaining == 0, "{r:?}");
        // Booleans or integers? The spec says integers: allowed is 0/1.
        let Value::Map(pairs) = q(&mut con, &algo.cmd(&key, 2, "1h")) else {
            unreachable!()
        };
        for (k, v) in &pairs {
            assert!(
                matches!(v, Value::Int(_)),
                "{}: {} should be an integer: {v:?}",
                algo.name(),
                string(k)
            );
        }
    }
    // The same connection in RESP2 gets arrays.
    let mut con2 = server.conn();
    let v = q(&mut con2, &Algo::TokenBucket.cmd("resp2", 2, "1h"));
    assert!(matches!(v, Value::Array(ref a) if a.len() == 5), "{v:?}");
}

/// TYPE says ratelimit; SCAN TYPE finds the keys; OBJECT/MEMORY work.
#[test]
fn type_and_key_commands() {
    let server = Server::start();
    let mut con = server.conn();
    for algo in Algo::ALL {
        let key = format!("type:{algo:?}");
        rl(&mut con, &algo.cmd(&key, 5, "1h"));
        assert_eq!(
            string(&q(&mut con, &argv!["TYPE", &key])),
            "ratelimit",
            "{}",
            algo.name()
        );
        let usage = int(&q(&mut con, &argv!["MEMORY", "USAGE", &key]));
        assert!(usage > 0, "{}: MEMORY USAGE {usage}", algo.name());
        let ttl = pttl(&mut con, &key);
        assert!(
            ttl > 0,
            "{}: a written key has an expiry: PTTL {ttl}",
            algo.name()
        );
    }
    q(&mut con, &argv!["SET", "plain", "x"]);
    let v = q(
        &mut con,
        &argv!["SCAN", 0, "COUNT", 1000, "TYPE", "ratelimit"],
    );
    let mut keys: Vec<String> = array(&array(&v)[1]).iter().map(string).collect();
    keys.sort();
    assert_eq!(
        keys,
        vec![
            "type:FixedWindow",
            "type:Gcra",
            "type:SlidingLog",
            "type:SlidingWindow",
            "type:TokenBucket"
        ]
    );
    // RENAME keeps the state (and the expiry).
    let before = key_state(&mut con, "type:SlidingLog");
    q(&mut con, &argv!["RENAME", "type:SlidingLog", "renamed"]);
    let after = key_state(&mut con, "renamed");
    assert_eq!(before.digest, after.digest);
    assert_eq!(before.expire_at, after.expire_at);
    let r = rl(&mut con, &Algo::SlidingLog.cmd("renamed", 5, "1h"));
    assert!(
        r.allowed && r.remaining == 3,
        "renamed log keeps its entry: {r:?}"
    );
    // DEL frees it; FLUSHALL too.
    assert_eq!(int(&q(&mut con, &argv!["DEL", "renamed"])), 1);
    q(&mut con, &argv!["FLUSHALL"]);
    assert_eq!(int(&q(&mut con, &argv!["DBSIZE"])), 0);
}

/// Calls with other parameters on the same key keep working (state carried
/// over, never an error) and report the new limit.
#[test]
fn parameter_change_on_the_same_key() {
    let server = Server::start();
    let mut con = server.conn();
    avoid_boundary(&mut con, ONE_HOUR_MS, 60_000);
    for algo in Algo::ALL {
        let key = format!("change:{algo:?}");
        rl(&mut con, &algo.cmd_with(&key, 10, "1h", &["COST", "4"]));
        let r = rl(&mut con, &algo.cmd(&key, 20, "1h"));
        assert!(r.allowed && r.limit == 20, "{}: {r:?}", algo.name());
        let r = rl(&mut con, &algo.cmd(&key, 3, "2h"));
        assert_eq!(r.limit, 3, "{}: {r:?}", algo.name());
        assert!(r.remaining <= 3);
        let r = rl(&mut con, &algo.cmd(&key, 3, "30m"));
        assert_eq!(r.limit, 3, "{}: {r:?}", algo.name());
    }
}

/// deny-oom: with maxmemory reached, a write is refused with OOM.
#[test]
fn deny_oom() {
    let server = Server::start();
    let mut con = server.conn();
    q(&mut con, &argv!["SET", "filler", "x".repeat(10_000)]);
    q(
        &mut con,
        &argv!["CONFIG", "SET", "maxmemory-policy", "noeviction"],
    );
    q(&mut con, &argv!["CONFIG", "SET", "maxmemory", 1]);
    for algo in Algo::ALL {
        let e = q_err(&mut con, &algo.cmd("oom", 5, "1h"));
        assert!(e.starts_with("OOM"), "{}: {e}", algo.name());
    }
    q(&mut con, &argv!["CONFIG", "SET", "maxmemory", 0]);
    rl(&mut con, &Algo::TokenBucket.cmd("oom", 5, "1h"));
}

/// BRIEF: one integer, 0 when allowed, else the wait in ms as the full
/// reply gives it, -1 when the cost can never fit; the state moves as with
/// the full reply.
#[test]
fn brief_replies_one_integer() {
    let server = Server::start();
    let mut con = server.conn();
    avoid_boundary(&mut con, ONE_HOUR_MS, 60_000);
    for algo in Algo::ALL {
        let key = format!("brief:{}", algo.name());
        for _ in 0..3 {
            assert_eq!(
                int(&q(&mut con, &algo.cmd_with(&key, 3, "1h", &["BRIEF"]))),
                0,
                "{key}"
            );
        }
        let full = rl(&mut con, &algo.cmd_with(&key, 3, "1h", &["DRYRUN"]));
        assert!(!full.allowed && full.retry_after > 0, "{key}: {full:?}");
        let wait = int(&q(&mut con, &algo.cmd_with(&key, 3, "1h", &["BRIEF"])));
        assert!(
            (wait - full.retry_after).abs() <= 50 && wait > 0,
            "{key}: {wait} vs {full:?}"
        );
        let never = algo.cmd_with(&key, 3, "1h", &["BRIEF", "COST", "4"]);
        assert_eq!(int(&q(&mut con, &never)), -1, "{key}");
        assert_eq!(
            Reply::parse(&q(&mut con, &argv!["RL.PEEK", key])).remaining,
            0
        );
    }
    let all = argv!["RL.ALL", 2, "{b}1", "{b}2", "WINDOW", 1, "1h", "WINDOW", 5, "1h", "BRIEF"];
    assert_eq!(int(&q(&mut con, &all)), 0);
    assert!(int(&q(&mut con, &all)) > 0);
    let mixed = argv!["RL.WINDOW", "b", 3, "1h", "BRIEF", "PARTIAL"];
    assert!(q_err(&mut con, &mixed).starts_with("ERR BRIEF and PARTIAL cannot be combined"));
}
