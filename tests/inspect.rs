//! RL.INSPECT: a limiter's raw state as named fields, read-only.

mod common;

use common::*;
use redis::Value;

/// RESP2 reply as (name, value) pairs, the names from RL.INSPECT's order.
fn fields(con: &mut redis::Connection, key: &str) -> Vec<(String, Value)> {
    let resp3 = q(con, &argv!["RL.INSPECT", key]);
    let Value::Map(pairs) = resp3 else {
        panic!("RL.INSPECT {key} under RESP3 is not a map: {resp3:?}")
    };
    pairs.into_iter().map(|(k, v)| (string(&k), v)).collect()
}

fn field(fields: &[(String, Value)], name: &str) -> Value {
    fields
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("no field {name} in {fields:?}"))
}

#[test]
fn inspect_reports_each_algorithm_without_writing() {
    let server = Server::start();
    let mut con = server.conn_resp3();
    avoid_boundary(&mut con, ONE_HOUR_MS, 60_000);
    assert_eq!(q(&mut con, &argv!["RL.INSPECT", "absent"]), Value::Nil);

    rl(
        &mut con,
        &argv!["RL.WINDOW", "sw", 10, "1h", "SLIDING", "COST", 3],
    );
    rl(&mut con, &argv!["RL.WINDOW", "fw", 10, "1h", "COST", 4]);
    rl(&mut con, &argv!["RL.SLIDINGLOG", "sl", 5, "1h", "COST", 2]);
    rl(&mut con, &argv!["RL.SLIDINGLOG", "sl", 5, "1h"]);
    rl(
        &mut con,
        &argv!["RL.TOKENBUCKET", "tb", 10, 1, "1h", "COST", 3],
    );
    rl(&mut con, &argv!["RL.GCRA", "g", 5, 1, "1h"]);
    q(&mut con, &argv!["RL.LEASE", "l", 3, "1h", "COST", 2]);
    let digests: Vec<Value> = ["sw", "fw", "sl", "tb", "g", "l"]
        .iter()
        .map(|k| q(&mut con, &argv!["DEBUG", "DIGEST-VALUE", k]))
        .collect();

    let now = int(&array(&q(&mut con, &argv!["TIME"]))[0]) * 1000;
    let sw = fields(&mut con, "sw");
    let names: Vec<&str> = sw.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "algorithm",
            "limit",
            "period_ms",
            "window_start_ms",
            "window_ends_in_ms",
            "current",
            "previous",
            "locked_until_ms"
        ]
    );
    assert_eq!(string(&field(&sw, "algorithm")), "window-sliding");
    assert_eq!(int(&field(&sw, "limit")), 10);
    assert_eq!(int(&field(&sw, "period_ms")), ONE_HOUR_MS);
    assert_eq!(int(&field(&sw, "current")), 3);
    assert_eq!(int(&field(&sw, "previous")), 0);
    let start = int(&field(&sw, "window_start_ms"));
    assert_eq!(start % ONE_HOUR_MS, 0, "aligned to the epoch");
    assert!((start..start + ONE_HOUR_MS).contains(&now) || now - start < ONE_HOUR_MS + 1000);
    let ends_in = int(&field(&sw, "window_ends_in_ms"));
    assert!(ends_in > 0 && ends_in <= ONE_HOUR_MS, "{ends_in}");
    assert_eq!(field(&sw, "locked_until_ms"), Value::Nil);

    let fw = fields(&mut con, "fw");
    assert_eq!(string(&field(&fw, "algorithm")), "window");
    assert_eq!(int(&field(&fw, "current")), 4);
    assert!(fw.iter().all(|(n, _)| n != "previous"));

    let sl = fields(&mut con, "sl");
    assert_eq!(string(&field(&sl, "algorithm")), "slidinglog");
    assert_eq!(int(&field(&sl, "count")), 3);
    // Requests logged in the same millisecond share one entry.
    assert!((1..=2).contains(&int(&field(&sl, "entries"))));
    let (oldest, newest) = (int(&field(&sl, "oldest_ms")), int(&field(&sl, "newest_ms")));
    assert!(
        oldest <= newest && (now - oldest).abs() < 5_000,
        "{oldest} {newest} {now}"
    );

    let tb = fields(&mut con, "tb");
    assert_eq!(string(&field(&tb, "algorithm")), "tokenbucket");
    assert_eq!(int(&field(&tb, "capacity")), 10);
    assert_eq!(int(&field(&tb, "refill_period_ms")), ONE_HOUR_MS);
    assert_eq!(int(&field(&tb, "tokens")), 7);
    // The stored level, in 1/refill_period_ms of a token, at the last update.
    let last = int(&field(&tb, "last_update_ms"));
    assert!((last - now).abs() < 5_000, "{last} {now}");
    assert_eq!(int(&field(&tb, "stored_level")) / ONE_HOUR_MS, 7);

    let g = fields(&mut con, "g");
    assert_eq!(string(&field(&g, "algorithm")), "gcra");
    assert_eq!((int(&field(&g, "burst")), int(&field(&g, "rate"))), (5, 1));
    let tat = int(&field(&g, "tat_ms"));
    assert!((tat - now - ONE_HOUR_MS).abs() < 5_000, "{tat} {now}");

    let l = fields(&mut con, "l");
    assert_eq!(string(&field(&l, "algorithm")), "lease");
    assert_eq!(
        (int(&field(&l, "in_use")), int(&field(&l, "leases"))),
        (2, 1)
    );

    for (k, digest) in ["sw", "fw", "sl", "tb", "g", "l"].iter().zip(digests) {
        assert_eq!(
            q(&mut con, &argv!["DEBUG", "DIGEST-VALUE", k]),
            digest,
            "{k}"
        );
    }
}

#[test]
fn inspect_shows_a_lock_and_the_previous_window() {
    let server = Server::start();
    let mut con = server.conn_resp3();
    rl(&mut con, &argv!["RL.SLIDINGLOG", "locked", 1, "1h"]);
    rl(
        &mut con,
        &argv!["RL.SLIDINGLOG", "locked", 1, "1h", "LOCKOUT", "10m"],
    );
    let until = int(&field(&fields(&mut con, "locked"), "locked_until_ms"));
    let now = int(&array(&q(&mut con, &argv!["TIME"]))[0]) * 1000;
    assert!((until - now - 600_000).abs() < 5_000, "{until} {now}");

    // A 200 ms sliding window: after one period the count is the previous one.
    avoid_boundary(&mut con, 200, 50);
    rl(
        &mut con,
        &argv!["RL.WINDOW", "short", 5, "200ms", "SLIDING", "COST", 2],
    );
    std::thread::sleep(std::time::Duration::from_millis(200));
    let f = fields(&mut con, "short");
    if int(&field(&f, "current")) == 0 && int(&field(&f, "previous")) == 2 {
        let ends_in = int(&field(&f, "window_ends_in_ms"));
        assert!((0..=200).contains(&ends_in), "{ends_in}");
    } else {
        panic!("expected the count in the previous window: {f:?}");
    }
}

#[test]
fn inspect_errors() {
    let server = Server::start();
    let mut con = server.conn();
    q(&mut con, &argv!["SET", "s", "x"]);
    assert!(q_err(&mut con, &argv!["RL.INSPECT", "s"]).starts_with("WRONGTYPE"));
    assert!(q_err(&mut con, &argv!["RL.INSPECT", "a", "b"]).starts_with("ERR wrong number"));
    // RESP2: the values in order, no names.
    rl(&mut con, &argv!["RL.WINDOW", "w", 3, "1h"]);
    let v = q(&mut con, &argv!["RL.INSPECT", "w"]);
    assert_eq!(string(&array(&v)[0]), "window");
    assert_eq!(int(&array(&v)[1]), 3);
}
