//! DRYRUN, COST 0 and denials write and propagate nothing; what is written
//! reaches the replica. `master_repl_offset` only moves while a replica (or
//! a backlog) exists, so every test here runs a primary with a replica, and
//! first checks that a real write does move the offset.

mod common;

use common::*;

const LIMIT: u64 = 5;

fn assert_offset_moves(primary: &Server) {
    let mut con = primary.conn();
    let before = repl_offset(&mut con);
    q(&mut con, &argv!["SET", "offset-canary", "x"]);
    let after = repl_offset(&mut con);
    assert!(
        after > before,
        "a SET should move master_repl_offset ({before} -> {after})"
    );
}

#[test]
fn dryrun_and_cost0_on_an_absent_key_write_nothing() {
    let (primary, replica) = primary_and_replica(&[]);
    assert_offset_moves(&primary);
    let mut con = primary.conn();
    avoid_boundary(&mut con, ONE_HOUR_MS, 60_000);
    for algo in Algo::ALL {
        let key = format!("absent:{algo:?}");
        let variants: Vec<Vec<&str>> = vec![
            vec!["DRYRUN"],
            vec!["COST", "0"],
            vec!["COST", "0", "DRYRUN"],
            vec!["DRYRUN", "COST", "3"],
            vec!["DRYRUN", "COST", "6"], // more than the limit
            vec!["COST", "6"],           // denied: more than the limit
        ];
        for options in &variants {
            let before = repl_offset(&mut con);
            let r = rl(&mut con, &algo.cmd_with(&key, LIMIT, "1h", options));
            let after = repl_offset(&mut con);
            assert_eq!(
                before,
                after,
                "{} {options:?} on an absent key moved the offset: {r:?}",
                algo.name()
            );
            assert!(
                !exists(&mut con, &key),
                "{} {options:?} created the key: {r:?}",
                algo.name()
            );
            let cost = options
                .iter()
                .position(|o| *o == "COST")
                .map(|i| options[i + 1].parse::<i64>().unwrap())
                .unwrap_or(1);
            if cost <= LIMIT as i64 {
                assert!(r.allowed, "{} {options:?}: {r:?}", algo.name());
                assert_eq!(
                    r.remaining,
                    LIMIT as i64 - cost,
                    "{} {options:?}",
                    algo.name()
                );
            } else {
                assert!(
                    !r.allowed && r.retry_after == -1,
                    "{} {options:?}: {r:?}",
                    algo.name()
                );
            }
            if cost == 0 || cost > LIMIT as i64 {
                assert_eq!(
                    r.reset_after,
                    0,
                    "{} {options:?}: nothing used, nothing to reset: {r:?}",
                    algo.name()
                );
            }
        }
        // And the sliding log with COUNTDENIED: a request above the limit is not logged.
        if algo == Algo::SlidingLog {
            let before = repl_offset(&mut con);
            let r = rl(
                &mut con,
                &argv![
                    "RL.SLIDINGLOG",
                    &key,
                    LIMIT,
                    "1h",
                    "COUNTDENIED",
                    "COST",
                    LIMIT + 1
                ],
            );
            assert!(!r.allowed && r.retry_after == -1, "{r:?}");
            assert_eq!(
                repl_offset(&mut con),
                before,
                "COUNTDENIED with cost > limit moved the offset"
            );
            assert!(
                !exists(&mut con, &key),
                "COUNTDENIED with cost > limit created the key"
            );
            let r = rl(
                &mut con,
                &argv!["RL.SLIDINGLOG", &key, LIMIT, "1h", "COUNTDENIED", "DRYRUN"],
            );
            assert!(r.allowed);
            assert_eq!(
                repl_offset(&mut con),
                before,
                "COUNTDENIED DRYRUN moved the offset"
            );
            assert!(
                !exists(&mut con, &key),
                "COUNTDENIED DRYRUN created the key"
            );
        }
        // A real call writes and propagates.
        let before = repl_offset(&mut con);
        rl(&mut con, &algo.cmd(&key, LIMIT, "1h"));
        assert!(
            repl_offset(&mut con) > before,
            "{}: a real call did not propagate",
            algo.name()
        );
        assert!(exists(&mut con, &key));
    }
    sync_replica(&primary, &replica);
    let mut rcon = replica.conn();
    for algo in Algo::ALL {
        let key = format!("absent:{algo:?}");
        assert_eq!(
            digest(&mut con, &key),
            digest(&mut rcon, &key),
            "{} on the replica",
            algo.name()
        );
    }
}

#[test]
fn dryrun_cost0_and_denials_leave_an_existing_key_untouched() {
    let (primary, replica) = primary_and_replica(&[]);
    assert_offset_moves(&primary);
    let mut con = primary.conn();
    avoid_boundary(&mut con, ONE_HOUR_MS, 60_000);
    for algo in Algo::ALL {
        let key = format!("existing:{algo:?}");
        // Partly used.
        rl(&mut con, &algo.cmd_with(&key, LIMIT, "1h", &["COST", "2"]));
        let check = |con: &mut redis::Connection, options: &[&str], what: &str| {
            let state = key_state(con, &key);
            let before = repl_offset(con);
            let r = rl(con, &algo.cmd_with(&key, LIMIT, "1h", options));
            assert_eq!(
                repl_offset(con),
                before,
                "{} {options:?} ({what}) moved the offset: {r:?}",
                algo.name()
            );
            assert_eq!(
                key_state(con, &key),
                state,
                "{} {options:?} ({what}) changed the key: {r:?}",
                algo.name()
            );
            r
        };
        let r = check(&mut con, &["DRYRUN"], "partly used");
        assert!(r.allowed && r.remaining == 2, "{r:?}");
        let r = check(&mut con, &["COST", "0"], "partly used");
        assert!(r.allowed && r.remaining == 3, "{r:?}");
        let r = check(&mut con, &["DRYRUN", "COST", "3"], "partly used");
        assert!(r.allowed && r.remaining == 0, "{r:?}");
        let r = check(&mut con, &["COST", "4"], "partly used, too much");
        assert!(!r.allowed && r.remaining == 3 && r.retry_after > 0, "{r:?}");
        let r = check(&mut con, &["COST", "6"], "more than the limit");
        assert!(!r.allowed && r.retry_after == -1, "{r:?}");
        // Exhausted.
        rl(&mut con, &algo.cmd_with(&key, LIMIT, "1h", &["COST", "3"]));
        let r = check(&mut con, &[], "exhausted");
        assert!(!r.allowed, "{r:?}");
        let r = check(&mut con, &["DRYRUN"], "exhausted");
        assert!(!r.allowed, "{r:?}");
        let r = check(&mut con, &["COST", "0"], "exhausted");
        assert!(
            r.allowed && r.remaining == 0,
            "COST 0 on an exhausted limiter: {r:?}"
        );
    }
    sync_replica(&primary, &replica);
    let mut rcon = replica.conn();
    for algo in Algo::ALL {
        let key = format!("existing:{algo:?}");
        assert_eq!(
            key_state(&mut con, &key),
            key_state(&mut rcon, &key),
            "{} on the replica",
            algo.name()
        );
    }
}

/// A DRYRUN gets the same reply as the real call right after it (same
/// MULTI/EXEC, so the same time), in every state; COST 0 reports the state
/// the real call left.
#[test]
fn dryrun_reply_equals_the_real_reply() {
    let server = Server::start();
    let mut con = server.conn();
    avoid_boundary(&mut con, ONE_HOUR_MS, 60_000);
    for algo in Algo::ALL {
        for period in ["1h", "2s"] {
            let key = format!("same:{algo:?}:{period}");
            for (i, cost) in [1u64, 2, 0, 1, 3, 1, 6, 1, 1, 2].into_iter().enumerate() {
                let cost = cost.to_string();
                let real = algo.cmd_with(&key, LIMIT, period, &["COST", &cost]);
                let dry = algo.cmd_with(&key, LIMIT, period, &["COST", &cost, "DRYRUN"]);
                let peek = algo.cmd_with(&key, LIMIT, period, &["COST", "0"]);
                let items = exec(&mut con, &[dry, real, peek]);
                let (dry, real, peek) = (
                    Reply::parse(&items[0]),
                    Reply::parse(&items[1]),
                    Reply::parse(&items[2]),
                );
                assert_eq!(
                    dry,
                    real,
                    "{} {period} call {i} (cost {cost}): DRYRUN vs real",
                    algo.name()
                );
                assert!(
                    peek.allowed,
                    "{}: COST 0 is always allowed: {peek:?}",
                    algo.name()
                );
                assert_eq!(peek.retry_after, 0);
                assert_eq!(peek.limit, real.limit);
                assert_eq!(
                    peek.remaining,
                    real.remaining,
                    "{} call {i}: COST 0 after {real:?}",
                    algo.name()
                );
                assert_eq!(
                    peek.reset_after,
                    real.reset_after,
                    "{} call {i}: COST 0 after {real:?}",
                    algo.name()
                );
            }
        }
    }
}

/// A denial writes nothing without COUNTDENIED, and is logged (and
/// propagated) with it.
#[test]
fn denials_propagate_only_with_countdenied() {
    let (primary, replica) = primary_and_replica(&[]);
    assert_offset_moves(&primary);
    let mut con = primary.conn();
    avoid_boundary(&mut con, ONE_HOUR_MS, 60_000);
    for algo in Algo::ALL {
        let key = format!("deny:{algo:?}");
        let cmd = algo.cmd(&key, 2, "1h");
        rl(&mut con, &cmd);
        rl(&mut con, &cmd);
        let before = repl_offset(&mut con);
        let state = key_state(&mut con, &key);
        for _ in 0..3 {
            assert!(!rl(&mut con, &cmd).allowed);
        }
        assert_eq!(
            repl_offset(&mut con),
            before,
            "{}: denials moved the offset",
            algo.name()
        );
        assert_eq!(
            key_state(&mut con, &key),
            state,
            "{}: denials changed the key",
            algo.name()
        );
    }
    let cmd = argv!["RL.SLIDINGLOG", "deny:counted", 2, "1h", "COUNTDENIED"];
    rl(&mut con, &cmd);
    rl(&mut con, &cmd);
    let before = repl_offset(&mut con);
    let state = key_state(&mut con, "deny:counted");
    let r = rl(&mut con, &cmd);
    assert!(!r.allowed, "{r:?}");
    assert!(
        repl_offset(&mut con) > before,
        "a COUNTDENIED denial should be logged and propagated"
    );
    assert_ne!(
        key_state(&mut con, "deny:counted").digest,
        state.digest,
        "a COUNTDENIED denial should be logged"
    );
    sync_replica(&primary, &replica);
    let mut rcon = replica.conn();
    for key in [
        "deny:TokenBucket",
        "deny:FixedWindow",
        "deny:SlidingWindow",
        "deny:SlidingLog",
        "deny:counted",
    ] {
        assert_eq!(
            key_state(&mut con, key),
            key_state(&mut rcon, key),
            "{key} on the replica"
        );
    }
}

/// With COUNTDENIED a steady stream of denied requests keeps the limiter
/// closed; without it, allowed requests come back once old ones leave. The
/// decisions are checked against an exact model of the log at the times the
/// server decided at.
#[test]
fn countdenied_keeps_a_flooding_client_out() {
    let server = Server::start();
    let mut con = server.conn();
    let period = 400i64;
    let limit = 2i64;
    for counted in [false, true] {
        let key = format!("flood:{counted}");
        let mut cmd = argv!["RL.SLIDINGLOG", &key, limit, format!("{period}ms")];
        if counted {
            cmd.push("COUNTDENIED".to_string());
        }
        let mut log: Vec<i64> = Vec::new();
        let mut allowed_total = 0;
        let start = server_time_ms(&mut con);
        let mut previous = start;
        let mut longest_gap = 0;
        while server_time_ms(&mut con) < start + 3 * period {
            let (t, r) = timed_rl(&mut con, &cmd);
            longest_gap = longest_gap.max(t - previous);
            previous = t;
            log.retain(|&at| at + period > t);
            let live = log.len() as i64;
            let expect = live < limit;
            assert_eq!(
                r.allowed, expect,
                "COUNTDENIED={counted}: at {t} the log holds {live} entries ({log:?}): {r:?}"
            );
            if expect {
                assert_eq!(r.remaining, limit - live - 1, "{r:?}");
                allowed_total += 1;
            }
            if expect || counted {
                log.push(t);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        if counted && longest_gap < period {
            assert_eq!(
                allowed_total, limit,
                "a flooding client under COUNTDENIED gets only the first {limit}"
            );
        } else if !counted {
            assert!(
                allowed_total > limit,
                "without COUNTDENIED the flood gets through again"
            );
        }
    }
}
