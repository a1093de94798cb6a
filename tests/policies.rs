//! Refunds (RL.REFUND), partial grants (PARTIAL) and lockouts (LOCKOUT,
//! RL.UNLOCK) against a real server, with replication and persistence.

mod common;

use common::*;
use redis::{Connection, Value};
use std::thread::sleep;
use std::time::Duration;

/// A reply of five standard fields plus one more (`refunded`, `granted`).
fn six(v: &Value) -> (Reply, i64) {
    let items = array(v);
    assert_eq!(items.len(), 6, "{v:?}");
    (
        Reply::parse(&Value::Array(items[..5].to_vec())),
        int(&items[5]),
    )
}

fn call6(con: &mut Connection, argv: &[String]) -> (Reply, i64) {
    six(&q(con, argv))
}

#[test]
fn refunds_give_back_what_each_algorithm_can() {
    let (primary, replica) = primary_and_replica(&[]);
    let mut con = primary.conn();
    avoid_boundary(&mut con, ONE_HOUR_MS, 60_000);
    for algo in Algo::ALL {
        let key = format!("refund:{algo:?}");
        rl(&mut con, &algo.cmd_with(&key, 5, "1h", &["COST", "3"]));
        let (after, refunded) = call6(&mut con, &argv!["RL.REFUND", &key, 2]);
        assert_eq!(
            (refunded, after.remaining, after.allowed),
            (2, 4, true),
            "{}",
            algo.name()
        );
        // Never beyond full: only what was consumed comes back.
        let (after, refunded) = call6(&mut con, &argv!["RL.REFUND", &key, 9]);
        assert_eq!((refunded, after.remaining), (1, 5), "{}", algo.name());
        let r = rl(&mut con, &algo.cmd_with(&key, 5, "1h", &["COST", "5"]));
        assert!(
            r.allowed,
            "{}: the refunded units are usable: {r:?}",
            algo.name()
        );
    }
    assert_eq!(q(&mut con, &argv!["RL.REFUND", "absent", 1]), Value::Nil);
    assert!(!exists(&mut con, "absent"));
    q(&mut con, &argv!["SET", "str", "x"]);
    assert!(q_err(&mut con, &argv!["RL.REFUND", "str", 1]).starts_with("WRONGTYPE"));
    let state = key_state(&mut con, "refund:TokenBucket");
    let offset = repl_offset(&mut con);
    for bad in ["0", "-1", "x", "1000000000000001"] {
        let e = q_err(&mut con, &argv!["RL.REFUND", "refund:TokenBucket", bad]);
        assert!(e.starts_with("ERR amount must be an integer from 1"), "{e}");
    }
    assert_eq!(key_state(&mut con, "refund:TokenBucket"), state);
    assert_eq!(repl_offset(&mut con), offset);
    sync_replica(&primary, &replica);
    let mut rcon = replica.conn();
    for algo in Algo::ALL {
        let key = format!("refund:{algo:?}");
        assert_eq!(
            digest(&mut rcon, &key),
            digest(&mut con, &key),
            "{}",
            algo.name()
        );
    }
}

/// A window's refund gives back only the current window's count: once the
/// window has moved on, a sliding counter's previous window keeps its count
/// (and a fixed window's key has expired: nil, the limiter is full).
#[test]
fn a_refund_after_the_window_moved_on_gives_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    avoid_boundary(&mut con, 300, 100);
    let (t, _) = timed_rl(
        &mut con,
        &argv!["RL.WINDOW", "w", 5, "300ms", "SLIDING", "COST", 4],
    );
    rl(&mut con, &argv!["RL.WINDOW", "f", 5, "300ms", "COST", 4]);
    sleep_until_server_ms(&mut con, t - t % 300 + 310);
    let (after, refunded) = call6(&mut con, &argv!["RL.REFUND", "w", 2]);
    assert_eq!(refunded, 0, "{after:?}");
    assert!(
        after.remaining < 5,
        "the previous window still weighs: {after:?}"
    );
    assert_eq!(q(&mut con, &argv!["RL.REFUND", "f", 2]), Value::Nil);
}

#[test]
fn partial_grants_what_is_there() {
    let server = Server::start();
    let mut con = server.conn();
    for algo in Algo::ALL {
        let key = format!("partial:{algo:?}");
        let cmd = algo.cmd_with(&key, 10, "1h", &["COST", "7", "PARTIAL"]);
        let (r, granted) = call6(&mut con, &cmd);
        assert_eq!(
            (r.allowed, granted, r.remaining),
            (true, 7, 3),
            "{}",
            algo.name()
        );
        let (r, granted) = call6(&mut con, &cmd);
        assert_eq!(
            (r.allowed, granted, r.remaining),
            (true, 3, 0),
            "{}",
            algo.name()
        );
        let (r, granted) = call6(&mut con, &cmd);
        assert_eq!((r.allowed, granted), (false, 0), "{}", algo.name());
        assert!(r.retry_after > 0, "when one unit comes back: {r:?}");
    }
    let mut resp3 = server.conn_resp3();
    let v = q(
        &mut resp3,
        &argv!["RL.GCRA", "p3", 5, 1, "1h", "COST", 9, "PARTIAL"],
    );
    let Value::Map(pairs) = &v else {
        panic!("{v:?}")
    };
    assert_eq!(string(&pairs[5].0), "granted");
    assert_eq!(int(&pairs[5].1), 5);
}

/// Five failures, then locked for the lockout regardless of refills; the
/// lock is replicated, survives a reload, and RL.UNLOCK lifts it.
#[test]
fn lockout_blocks_until_it_ends_or_is_lifted() {
    let (primary, replica) = primary_and_replica(&[]);
    let mut con = primary.conn();
    let cmd = argv!["RL.SLIDINGLOG", "login", 3, "500ms", "LOCKOUT", "3s"];
    for _ in 0..3 {
        assert!(rl(&mut con, &cmd).allowed);
    }
    let denied = rl(&mut con, &cmd);
    assert!(!denied.allowed && denied.retry_after > 2_900, "{denied:?}");
    assert!(pttl(&mut con, "login") > 2_900);
    // The log alone would allow again after 500 ms; the lock holds.
    sleep(Duration::from_millis(700));
    let r = rl(&mut con, &cmd);
    assert!(!r.allowed && r.retry_after > 2_000, "{r:?}");
    let peek = Reply::parse(&q(&mut con, &argv!["RL.PEEK", "login"]));
    assert_eq!(peek.remaining, 0);
    sync_replica(&primary, &replica);
    assert_eq!(
        digest(&mut replica.conn(), "login"),
        digest(&mut con, "login")
    );
    let before = digest(&mut con, "login");
    q(&mut con, &argv!["DEBUG", "RELOAD"]);
    assert_eq!(
        digest(&mut con, "login"),
        before,
        "the lock survives a reload"
    );
    assert!(!rl(&mut con, &cmd).allowed);
    assert_eq!(int(&q(&mut con, &argv!["RL.UNLOCK", "login"])), 1);
    assert_eq!(int(&q(&mut con, &argv!["RL.UNLOCK", "login"])), 0);
    assert!(
        rl(&mut con, &cmd).allowed,
        "unlocked, and the log has room again"
    );
    sync_replica(&primary, &replica);
    assert_eq!(
        digest(&mut replica.conn(), "login"),
        digest(&mut con, "login")
    );

    // A lock that ends by itself: allowed again after it.
    let cmd = argv!["RL.GCRA", "g", 1, 1, "100ms", "LOCKOUT", "400ms"];
    assert!(rl(&mut con, &cmd).allowed);
    let denied = rl(&mut con, &cmd);
    assert!(!denied.allowed && denied.retry_after > 300, "{denied:?}");
    sleep(Duration::from_millis(denied.retry_after as u64 + 5));
    assert!(rl(&mut con, &cmd).allowed);
    // CL.THROTTLE on a locked key is limited too.
    rl(&mut con, &cmd);
    let v = q(&mut con, &argv!["CL.THROTTLE", "g", 0, 1, 1]);
    assert_eq!(int(&array(&v)[0]), 1, "{v:?}");
}
