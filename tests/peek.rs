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
