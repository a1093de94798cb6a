//! RL.TOPDENIED against a real server: exact counts while the keys fit the
//! sketch, the error bound when they do not, only denials counted (not
//! allowed requests, not dry runs), intervals rolling over, RESP2 and RESP3,
//! the configs.

mod common;

use common::*;
use redis::{Connection, Value};

/// (key, denied, error) of the current interval, and its denials.
fn current(con: &mut Connection, count: u64) -> (i64, Vec<(String, i64, i64)>) {
    let reply = array(&q(con, &argv!["RL.TOPDENIED", count])).to_vec();
    let interval = array(&reply[1]).to_vec();
    let keys = array(&interval[3])
        .iter()
        .map(|entry| {
            let e = array(entry);
            (string(&e[0]), int(&e[1]), int(&e[2]))
        })
        .collect();
    (int(&interval[1]), keys)
}

fn deny(con: &mut Connection, key: &str, times: usize) {
    q(con, &argv!["RL.WINDOW", key, 1, "1h"]);
    for _ in 0..times {
        assert_eq!(
            int(&array(&q(con, &argv!["RL.WINDOW", key, 1, "1h"]))[0]),
            0
        );
    }
}

#[test]
fn counts_denials_only_and_exactly_while_they_fit() {
    let server = Server::start_with(&["--ratelimit.denied-report-interval", "3600"]);
    let mut con = server.conn();
    deny(&mut con, "hot", 5);
    deny(&mut con, "warm", 3);
    deny(&mut con, "cool", 1);
    // Allowed requests and dry runs are not denials.
    for _ in 0..20 {
        q(&mut con, &argv!["RL.TOKENBUCKET", "fine", 100, 1, "1s"]);
    }
    q(&mut con, &argv!["RL.WINDOW", "hot", 1, "1h", "DRYRUN"]);
    // RL.ALL names each limiter that denied.
    q(
        &mut con,
        &argv!["RL.ALL", 2, "{x}a", "{x}b", "WINDOW", 1, "1h", "WINDOW", 5, "1h", "COST", 2],
    );
    let (denials, keys) = current(&mut con, 10);
    assert_eq!(denials, 10);
    assert_eq!(
        keys,
        vec![
            ("hot".into(), 5, 0),
            ("warm".into(), 3, 0),
            ("cool".into(), 1, 0),
            ("{x}a".into(), 1, 0)
        ]
    );
    assert_eq!(current(&mut con, 2).1.len(), 2);
    let error = q_err(&mut con, &argv!["RL.TOPDENIED", 0]);
    assert!(
        error.starts_with("ERR count must be an integer from 1 to 10000"),
        "{error}"
    );
}

#[test]
fn a_small_sketch_keeps_the_heavy_keys_within_its_bound() {
    let server = Server::start_with(&[
        "--ratelimit.denied-report-size",
        "3",
        "--ratelimit.denied-report-interval",
        "3600",
    ]);
    let mut con = server.conn();
    deny(&mut con, "attacker", 30);
    for n in 0..20 {
        deny(&mut con, &format!("user:{n}"), 1);
    }
    let (denials, keys) = current(&mut con, 10);
    assert_eq!(denials, 50);
    assert_eq!(keys.len(), 3);
    let (key, count, error) = &keys[0];
    assert_eq!(key, "attacker");
    // Space-Saving: never under the truth, over it by at most the error,
    // the error at most N / size.
    assert!(
        *count >= 30 && count - 30 <= *error && *error <= 50 / 3,
        "{keys:?}"
    );
    for (_, _, error) in &keys {
        assert!(*error <= 50 / 3);
    }
}

#[test]
fn intervals_roll_over_and_resp3_is_a_map() {
    let server = Server::start_with(&["--ratelimit.denied-report-interval", "1"]);
    let mut con = server.conn();
    // Just after a second starts, so both denials fall in one interval.
    let now = server_time_ms(&mut con);
    sleep_until_server_ms(&mut con, now - now % 1000 + 1000 + 50);
    deny(&mut con, "k", 2);
    let start = server_time_ms(&mut con) / 1000 * 1000;
    sleep_until_server_ms(&mut con, start + 1000 + 50);
    let reply = array(&q(&mut con, &argv!["RL.TOPDENIED"])).to_vec();
    assert_eq!(int(&reply[0]), 1000);
    assert_eq!(int(&array(&reply[1])[1]), 0, "the new interval is empty");
    let previous = array(&reply[2]).to_vec();
    assert_eq!(int(&previous[0]), start);
    assert_eq!(int(&previous[1]), 2);
    let mut resp3 = server.conn_resp3();
    match q(&mut resp3, &argv!["RL.TOPDENIED"]) {
        Value::Map(fields) => {
            let names: Vec<String> = fields.iter().map(|(k, _)| string(k)).collect();
            assert_eq!(names, ["interval_ms", "current", "previous"]);
        }
        other => panic!("RESP3 reply is not a map: {other:?}"),
    }
    // Off: nothing kept, nothing shown.
    q(
        &mut con,
        &argv!["CONFIG", "SET", "ratelimit.denied-report-size", 0],
    );
    deny(&mut con, "k2", 1);
    let reply = array(&q(&mut con, &argv!["RL.TOPDENIED"])).to_vec();
    assert_eq!((&reply[1], &reply[2]), (&Value::Nil, &Value::Nil));
}
