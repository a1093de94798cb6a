//! Calendar windows against a real server: the syntax and its errors
//! (nothing written), the reply, the key's expiry and RL.PEEK at the real
//! boundary, stored policies and RL.ALL, DUMP/RESTORE, a restart and
//! replication in the middle of a period, with a replica whose TZ differs.
//! The boundaries themselves (DST, month ends, leap days, anchors) are
//! tested on exact instants in src/core/calendar.rs and on a faked clock in
//! tests/clocks.rs.

mod common;

use common::*;
use redis::Connection;

/// The five fields of a reply.
fn fields(con: &mut Connection, argv: &[String]) -> [i64; 5] {
    let reply = array(&q(con, argv)).to_vec();
    std::array::from_fn(|i| int(&reply[i]))
}

/// `reset_after_ms` of a fresh calendar window, and the PTTL it set, agree
/// and point at the end of the calendar period holding the server's now.
fn assert_reset_at_boundary(
    con: &mut Connection,
    key: &str,
    spec: &[&str],
    boundary_of: impl Fn(i64) -> i64,
) {
    let before = server_time_ms(con);
    let mut argv = argv!["RL.WINDOW", key, 5];
    argv.extend(spec.iter().map(|s| s.to_string()));
    let [allowed, limit, remaining, retry, reset] = fields(con, &argv);
    let after = server_time_ms(con);
    assert_eq!((allowed, limit, remaining, retry), (1, 5, 4, 0), "{spec:?}");
    let boundary = boundary_of(before);
    assert_eq!(
        boundary,
        boundary_of(after),
        "a boundary passed during the test"
    );
    assert!(
        (boundary - after..=boundary - before).contains(&reset),
        "{spec:?}: reset {reset}, boundary in {}..{}",
        boundary - after,
        boundary - before
    );
    assert_eq!(
        pexpiretime(con, key),
        boundary,
        "{spec:?}: the key expires at the boundary"
    );
    let peek = array(&q(con, &argv!["RL.PEEK", key])).to_vec();
    assert!(
        (reset - 1000..=reset).contains(&int(&peek[4])),
        "{spec:?}: RL.PEEK"
    );
}

const DAY: i64 = 86_400_000;

#[test]
fn utc_days_weeks_and_years_end_at_their_boundaries() {
    let server = Server::start();
    let mut con = server.conn();
    assert_reset_at_boundary(&mut con, "day", &["day"], |now| now - now % DAY + DAY);
    // 1970-01-01 was a Thursday: Monday-based weeks start 3 days later.
    let monday = |now: i64| {
        let since = (now - 4 * DAY).rem_euclid(7 * DAY);
        now - since + 7 * DAY
    };
    assert_reset_at_boundary(&mut con, "week", &["week", "ANCHOR", "monday"], monday);
    assert_reset_at_boundary(
        &mut con,
        "week:tz",
        &["WEEK", "tz", "utc", "anchor", "mon"],
        monday,
    );
}

#[test]
fn a_limit_holds_in_its_period_and_errors_write_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    for _ in 0..3 {
        assert_eq!(
            fields(
                &mut con,
                &argv!["RL.WINDOW", "q", 3, "month", "TZ", "Europe/Berlin"]
            )[0],
            1
        );
    }
    let denied = fields(
        &mut con,
        &argv!["RL.WINDOW", "q", 3, "month", "TZ", "Europe/Berlin"],
    );
    assert_eq!(&denied[..3], &[0, 3, 0]);
    assert_eq!(denied[3], denied[4], "the retry is the period's end");
    let digest_before = digest(&mut con, "q");
    for (argv, error) in [
        (
            argv!["RL.WINDOW", "q", 3, "month", "TZ", "Mars/Olympus"],
            "ERR TZ must be UTC or an IANA time zone",
        ),
        (
            argv!["RL.WINDOW", "q", 3, "month", "ANCHOR", 32],
            "ERR ANCHOR must be a day of the month",
        ),
        (
            argv!["RL.WINDOW", "q", 3, "day", "ANCHOR", 1],
            "ERR ANCHOR applies to week",
        ),
        (
            argv!["RL.WINDOW", "q", 3, "week", "ANCHOR", "someday"],
            "ERR ANCHOR must be a day of the week",
        ),
        (
            argv!["RL.WINDOW", "q", 3, "month", "SLIDING"],
            "ERR SLIDING does not apply to a calendar window",
        ),
        (
            argv!["RL.WINDOW", "q", 3, "1h"],
            "WRONGTYPE key holds a calendar window",
        ),
        (
            argv!["RL.WINDOW", "fresh", 3, "fortnight"],
            "ERR period must be a duration",
        ),
    ] {
        let got = q_err(&mut con, &argv);
        assert!(got.starts_with(error), "{argv:?}: {got}");
    }
    assert_eq!(digest(&mut con, "q"), digest_before);
    assert!(!exists(&mut con, "fresh"));
    // A refund gives back to this period; a raised limit applies at once.
    let refunded = array(&q(&mut con, &argv!["RL.REFUND", "q", 1])).to_vec();
    assert_eq!(int(&refunded[5]), 1);
    assert_eq!(
        fields(
            &mut con,
            &argv!["RL.WINDOW", "q", 3, "month", "TZ", "Europe/Berlin"]
        )[0],
        1
    );
    assert_eq!(
        fields(
            &mut con,
            &argv!["RL.WINDOW", "q", 4, "month", "TZ", "Europe/Berlin"]
        )[0],
        1
    );
    assert_eq!(
        fields(
            &mut con,
            &argv!["RL.WINDOW", "q", 4, "month", "TZ", "Europe/Berlin"]
        )[0],
        0
    );
}

#[test]
fn policies_and_rl_all_take_calendar_windows() {
    let server = Server::start();
    let mut con = server.conn();
    q(
        &mut con,
        &argv![
            "RL.POLICY.SET",
            "monthly",
            "WINDOW",
            2,
            "month",
            "TZ",
            "Asia/Tokyo",
            "ANCHOR",
            15
        ],
    );
    let definition: Vec<String> = array(&q(&mut con, &argv!["RL.POLICY.GET", "monthly"]))
        .iter()
        .map(string)
        .collect();
    assert_eq!(
        definition,
        ["WINDOW", "2", "month", "TZ", "Asia/Tokyo", "ANCHOR", "15"]
    );
    assert_eq!(fields(&mut con, &argv!["RL.LIMIT", "m", "monthly"])[0], 1);
    assert_eq!(
        fields(&mut con, &argv!["RL.LIMIT", "m", "monthly", "COST", 2])[0],
        0
    );
    // RL.ALL: a yearly quota beside a token bucket, all or nothing.
    let all = |con: &mut Connection| {
        let reply = array(&q(
            con,
            &argv![
                "RL.ALL",
                2,
                "{u}y",
                "{u}tb",
                "WINDOW",
                1,
                "year",
                "TZ",
                "UTC",
                "TOKENBUCKET",
                5,
                1,
                "1h"
            ],
        ))
        .to_vec();
        int(&reply[0])
    };
    assert_eq!(all(&mut con), 1);
    assert_eq!(all(&mut con), 0);
    let tb = array(&q(&mut con, &argv!["RL.PEEK", "{u}tb"])).to_vec();
    assert_eq!(
        int(&tb[2]),
        4,
        "the denied call took nothing from the bucket"
    );
    let error = q_err(
        &mut con,
        &argv!["RL.ALL", 1, "x", "WINDOW", 1, "year", "SLIDING"],
    );
    assert!(error.starts_with("ERR SLIDING does not apply"), "{error}");
}

#[test]
fn restart_dump_restore_and_replicas_keep_the_period() {
    let mut primary = Server::start();
    // The replica lives in another zone: it applies the primary's effects,
    // which carry the period, and never computes one.
    let replica = start_replica_with_env(&primary, &server_binary(), &[("TZ", "Pacific/Auckland")]);
    let mut con = primary.conn();
    let keys: Vec<String> = ["m", "w", "d"].iter().map(|k| k.to_string()).collect();
    q(
        &mut con,
        &argv![
            "RL.WINDOW",
            "m",
            10,
            "month",
            "TZ",
            "America/New_York",
            "ANCHOR",
            31,
            "COST",
            3
        ],
    );
    q(
        &mut con,
        &argv![
            "RL.WINDOW",
            "w",
            10,
            "week",
            "TZ",
            "Australia/Sydney",
            "ANCHOR",
            "sun"
        ],
    );
    q(
        &mut con,
        &argv![
            "RL.WINDOW",
            "d",
            10,
            "day",
            "TZ",
            "Europe/Berlin",
            "COST",
            10
        ],
    );
    sync_replica(&primary, &replica);
    let on_primary = digests_and_expiries(&mut con, &keys);
    assert_eq!(
        digests_and_expiries(&mut replica.conn(), &keys),
        on_primary,
        "replica"
    );
    let payload = dump(&mut con, "m").expect("m");
    let mut restore = to_cmd(&argv!["RESTORE", "m:copy", 0]);
    restore.arg(payload.as_slice());
    assert_eq!(error_of(&raw_cmd(&mut con, &restore)), None);
    assert_eq!(
        array(&q(&mut con, &argv!["RL.PEEK", "m:copy"]))[2],
        array(&q(&mut con, &argv!["RL.PEEK", "m"]))[2]
    );
    primary.restart(Shutdown::Save);
    let mut con = primary.conn();
    assert_eq!(digests_and_expiries(&mut con, &keys), on_primary, "restart");
    let denied = fields(
        &mut con,
        &argv!["RL.WINDOW", "d", 10, "day", "TZ", "Europe/Berlin"],
    );
    assert_eq!(denied[0], 0, "the day's count survived the restart");
}
