//! MULTI/EXEC and scripts: calls see one time, decisions stay sequential.

mod common;

use common::*;
use redis::Value;

#[test]
fn multi_decides_in_order() {
    let server = Server::start();
    let mut con = server.conn();
    let cmd = argv!["RL.TOKENBUCKET", "tb", 2, 1, "1h"];
    let items = exec(&mut con, &[cmd.clone(), cmd.clone(), cmd.clone()]);
    let replies: Vec<Reply> = items.iter().map(Reply::parse).collect();
    assert_eq!(
        replies.iter().map(|r| r.allowed).collect::<Vec<_>>(),
        vec![true, true, false],
        "{replies:?}"
    );
    assert_eq!(replies[0].remaining, 1);
    assert_eq!(replies[1].remaining, 0);
    assert!(replies[2].retry_after > 0);
}

/// Every call in one EXEC sees the same time, even with a pause between
/// them: two fresh fixed windows report the same reset_after_ms, and a token
/// bucket refilling 1 token per ms refills nothing across a 50 ms pause.
#[test]
fn multi_sees_one_time() {
    let server = Server::start();
    let mut con = server.conn();
    let (t, items) = timed(
        &mut con,
        &[
            argv!["RL.WINDOW", "w1", 5, "10s"],
            argv!["RL.TOKENBUCKET", "tb", 1000, 1, "1ms", "COST", 1000],
            argv!["DEBUG", "SLEEP", "0.05"],
            argv!["RL.WINDOW", "w2", 5, "10s"],
            argv!["RL.TOKENBUCKET", "tb", 1000, 1, "1ms"],
            argv!["TIME"],
        ],
    );
    let w1 = Reply::parse(&items[0]);
    let w2 = Reply::parse(&items[3]);
    assert_eq!(w1.reset_after, 10_000 - t % 10_000, "at {t}");
    assert_eq!(
        w1.reset_after, w2.reset_after,
        "two calls in one EXEC saw different times"
    );
    let drained = Reply::parse(&items[1]);
    assert!(drained.allowed && drained.remaining == 0, "{drained:?}");
    let after = Reply::parse(&items[4]);
    assert!(
        !after.allowed && after.retry_after == 1,
        "50 ms passed inside the EXEC but the module must use the cached time: {after:?}"
    );
    // Outside the transaction time moves on.
    let r = rl(&mut con, &argv!["RL.TOKENBUCKET", "tb", 1000, 1, "1ms"]);
    assert!(r.allowed, "{r:?}");
}

#[test]
fn scripts_return_the_reply_and_see_one_time() {
    let server = Server::start();
    let mut con = server.conn();
    for call in ["server.call", "redis.call"] {
        let key = format!("eval:{call}");
        let script = format!("return {call}('RL.TOKENBUCKET', KEYS[1], ARGV[1], ARGV[2], ARGV[3])");
        for expected_remaining in [1, 0] {
            let v = q(&mut con, &argv!["EVAL", &script, 1, &key, 2, 1, "1h"]);
            let r = Reply::parse(&v);
            assert!(
                r.allowed && r.remaining == expected_remaining,
                "{call}: {r:?}"
            );
        }
        let r = Reply::parse(&q(&mut con, &argv!["EVAL", &script, 1, &key, 2, 1, "1h"]));
        assert!(!r.allowed && r.retry_after > 0, "{call}: {r:?}");
    }
    // Two calls in one script: the same time.
    let script = "local a = server.call('RL.WINDOW', KEYS[1], '5', '10s') \
                  local b = server.call('RL.WINDOW', KEYS[2], '5', '10s') \
                  return {a[5], b[5]}";
    for _ in 0..20 {
        let v = q(&mut con, &argv!["EVAL", script, 2, "{s}a", "{s}b"]);
        let resets: Vec<i64> = array(&v).iter().map(int).collect();
        assert_eq!(
            resets[0], resets[1],
            "two calls in one script saw different times"
        );
        q(&mut con, &argv!["DEL", "{s}a", "{s}b"]);
    }
    // Scripts run RL commands on every algorithm; denials inside a script too.
    let script = "local out = {} \
                  for i = 1, 3 do out[i] = server.call('RL.SLIDINGLOG', KEYS[1], '2', '1h')[1] end \
                  return out";
    let v = q(&mut con, &argv!["EVAL", script, 1, "log"]);
    assert_eq!(array(&v).iter().map(int).collect::<Vec<_>>(), vec![1, 1, 0]);
    // FUNCTION too.
    let lib = "#!lua name=rltest\n\
               redis.register_function('take', function(keys, args) \
               return redis.call('RL.WINDOW', keys[1], args[1], args[2]) end)";
    q(&mut con, &argv!["FUNCTION", "LOAD", lib]);
    let r = Reply::parse(&q(&mut con, &argv!["FCALL", "take", 1, "fk", 1, "1h"]));
    assert!(r.allowed && r.limit == 1, "{r:?}");
    let r = Reply::parse(&q(&mut con, &argv!["FCALL", "take", 1, "fk", 1, "1h"]));
    assert!(!r.allowed, "{r:?}");
}

/// A read-only script may not call a write command.
#[test]
fn read_only_scripts_are_refused() {
    let server = Server::start();
    let mut con = server.conn();
    let e = q_err(
        &mut con,
        &argv![
            "EVAL_RO",
            "return server.call('RL.TOKENBUCKET', KEYS[1], '2', '1', '1h')",
            1,
            "ro"
        ],
    );
    assert!(
        e.contains("Write commands are not allowed") || e.to_lowercase().contains("write"),
        "{e}"
    );
    assert!(!exists(&mut con, "ro"));
}

/// WATCH sees a limiter change as a key change.
#[test]
fn watch_is_triggered_by_a_write_but_not_by_a_dryrun() {
    let server = Server::start();
    let mut con = server.conn();
    let mut other = server.conn();
    rl(&mut con, &argv!["RL.SLIDINGLOG", "wk", 5, "1h"]);
    // A DRYRUN from another client does not touch the key.
    q(&mut con, &argv!["WATCH", "wk"]);
    rl(&mut other, &argv!["RL.SLIDINGLOG", "wk", 5, "1h", "DRYRUN"]);
    rl(
        &mut other,
        &argv!["RL.SLIDINGLOG", "wk", 5, "1h", "COST", 0],
    );
    // Nor does a denied request: it changes nothing.
    let denied = rl(
        &mut other,
        &argv!["RL.SLIDINGLOG", "wk", 5, "1h", "COST", 5],
    );
    assert!(!denied.allowed, "{denied:?}");
    q(&mut con, &argv!["MULTI"]);
    q(&mut con, &argv!["PING"]);
    let v = raw(&mut con, &argv!["EXEC"]);
    assert!(
        matches!(v, Value::Array(_)),
        "EXEC aborted after a DRYRUN, a peek or a denial by another client: {v:?}"
    );
    // A real call does.
    q(&mut con, &argv!["WATCH", "wk"]);
    rl(&mut other, &argv!["RL.SLIDINGLOG", "wk", 5, "1h"]);
    q(&mut con, &argv!["MULTI"]);
    q(&mut con, &argv!["PING"]);
    let v = raw(&mut con, &argv!["EXEC"]);
    assert_eq!(
        v,
        Value::Nil,
        "EXEC should abort after another client's write"
    );
}
