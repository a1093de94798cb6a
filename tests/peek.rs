//! RL.PEEK: read-only state of a limiter under its own parameters.

mod common;

use common::*;
use redis::Value;

#[test]
fn peek_reports_state_without_changing_it() {
    let (primary, replica) = primary_and_replica(&[]);
    let mut con = primary.conn();
    assert_eq!(q(&mut con, &argv!["RL.PEEK", "absent"]), Value::Nil);
    rl(
        &mut con,
        &argv!["RL.TOKENBUCKET", "tb", "10", "1", "1h", "COST", "3"],
    );
    rl(
        &mut con,
        &argv!["RL.SLIDINGLOG", "sl", "5", "1h", "COST", "2"],
    );
    rl(&mut con, &argv!["RL.WINDOW", "sw", "4", "1h", "SLIDING"]);
    sync_replica(&primary, &replica);
    let offset = repl_offset(&mut con);
    let mut on_replica = replica.conn();
    for (key, limit, remaining) in [("tb", 10, 7), ("sl", 5, 3), ("sw", 4, 3)] {
        let digest = q(&mut con, &argv!["DEBUG", "DIGEST-VALUE", key]);
        for c in [&mut con, &mut on_replica] {
            let reply = Reply::parse(&q(c, &argv!["RL.PEEK", key]));
            assert_eq!(
                (reply.allowed, reply.limit, reply.remaining),
                (true, limit, remaining),
                "{key}"
            );
            assert_eq!(reply.retry_after, 0);
            assert!(reply.reset_after > 0);
        }
        assert_eq!(q(&mut con, &argv!["DEBUG", "DIGEST-VALUE", key]), digest);
    }
    assert_eq!(
        repl_offset(&mut con),
        offset,
        "RL.PEEK must propagate nothing"
    );
    q(&mut con, &argv!["SET", "s", "x"]);
    assert!(q_err(&mut con, &argv!["RL.PEEK", "s"]).starts_with("WRONGTYPE"));
    assert!(q_err(&mut con, &argv!["RL.PEEK"]).starts_with("ERR wrong number of arguments"));
}

/// The peek contract over a lowered limit, for every algorithm: `COST 0` and
/// `DRYRUN COST 0` ask for nothing, so they are allowed with no wait and
/// report `remaining = 0`; a `DRYRUN` with a cost answers what the real call
/// answers; RL.PEEK (stored parameters) is allowed too. Nothing is written.
#[test]
fn peeks_over_a_lowered_limit_are_allowed_and_agree() {
    let server = Server::start();
    let mut con = server.conn();
    avoid_boundary(&mut con, ONE_HOUR_MS, 60_000);
    for algo in Algo::ALL {
        let key = format!("lowered:{}", algo.name());
        for _ in 0..5 {
            assert!(rl(&mut con, &algo.cmd(&key, 5, "1h")).allowed, "{key}");
        }
        let before = digest(&mut con, &key);
        let offset = repl_offset(&mut con);
        for options in [&["COST", "0"][..], &["DRYRUN", "COST", "0"]] {
            let reply = rl(&mut con, &algo.cmd_with(&key, 2, "1h", options));
            assert!(reply.allowed, "{key} {options:?}: a peek is allowed");
            assert_eq!(reply.retry_after, 0, "{key} {options:?}");
            assert_eq!((reply.limit, reply.remaining), (2, 0), "{key} {options:?}");
            assert!(reply.reset_after > 0, "{key} {options:?}");
        }
        let dry = rl(&mut con, &algo.cmd_with(&key, 2, "1h", &["DRYRUN"]));
        assert_eq!(digest(&mut con, &key), before, "{key}: a peek wrote");
        assert_eq!(repl_offset(&mut con), offset, "{key}: a peek propagated");
        let real = rl(&mut con, &algo.cmd(&key, 2, "1h"));
        assert!(!dry.allowed && !real.allowed, "{key}");
        assert_eq!((dry.limit, dry.remaining), (real.limit, real.remaining));
        assert!(dry.retry_after > 0, "{key}: {dry:?}");
        assert!((dry.retry_after - real.retry_after).abs() <= 50, "{key}");
        // Only the token bucket and GCRA store new parameters on a denial.
        let stored_limit = match algo {
            Algo::TokenBucket | Algo::Gcra => 2,
            _ => 5,
        };
        let peek = Reply::parse(&q(&mut con, &argv!["RL.PEEK", key]));
        assert!(peek.allowed, "{key}: RL.PEEK {peek:?}");
        assert_eq!(peek.retry_after, 0, "{key}");
        assert_eq!((peek.limit, peek.remaining), (stored_limit, 0), "{key}");
    }
}
