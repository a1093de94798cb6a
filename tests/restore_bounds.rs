//! A value the module accepts stays loadable: RESTORE of a value at the
//! edge of the bounds, then commands on it, then DUMP/RESTORE, DEBUG RELOAD
//! and a restart keep every key; values no command could have written are
//! refused at RESTORE and at RL.APPLY, leaving nothing behind.

mod common;

use common::*;
use redis::Connection;

const MAX_TIME: u64 = 1 << 53;
const DAY: u64 = 86_400_000;

fn words(kind: u8, fields: &[u64]) -> Vec<u8> {
    let mut bytes = vec![1, kind];
    for field in fields {
        bytes.extend_from_slice(&field.to_le_bytes());
    }
    bytes
}

fn restore(con: &mut Connection, key: &str, payload: &[u8]) -> Result<(), String> {
    let mut cmd = to_cmd(&argv!["RESTORE", key, 0]);
    cmd.arg(payload).arg("REPLACE");
    match error_of(&raw_cmd(con, &cmd)) {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

/// A server whose DUMPs carry the module's bytes uncompressed, and a real
/// DUMP of a lease limiter to wrap other bytes in.
fn setup() -> (Server, Connection, Vec<u8>) {
    let server = Server::start();
    let mut con = server.conn();
    q(&mut con, &argv!["CONFIG", "SET", "rdbcompression", "no"]);
    q(&mut con, &argv!["RL.LEASE", "template", 5, "1h"]);
    let template = dump(&mut con, "template").expect("a limiter");
    (server, con, template)
}

fn refused(con: &mut Connection, template: &[u8], codec: &[u8], what: &str) {
    let error = restore(con, "refused", &dump_with_codec(template, codec))
        .expect_err(&format!("RESTORE of {what} was accepted"));
    assert!(error.contains("Bad data format"), "{what}: {error}");
    assert!(
        !exists(con, "refused"),
        "{what}: a refused RESTORE left a key"
    );
}

fn accepted(con: &mut Connection, template: &[u8], codec: &[u8], what: &str) {
    restore(con, "accepted", &dump_with_codec(template, codec))
        .unwrap_or_else(|e| panic!("RESTORE of {what} refused: {e}"));
}

/// The reported data loss: a lease limiter stored at 2^53 ms, granted a
/// lease, must DUMP/RESTORE, DEBUG RELOAD and restart with every key.
#[test]
fn a_lease_limiter_at_the_latest_time_stays_loadable() {
    let (mut server, mut con, template) = setup();
    let at_max = words(7, &[5, MAX_TIME, 0]);
    restore(&mut con, "k", &dump_with_codec(&template, &at_max)).expect("RESTORE");
    let reply = array(&q(&mut con, &argv!["RL.LEASE", "k", 5, "1h"])).to_vec();
    assert_eq!(int(&reply[0]), 1, "granted");
    for n in 0..20 {
        q(&mut con, &argv!["SET", format!("z{n}"), n]);
    }
    let payload = dump(&mut con, "k").expect("k");
    restore(&mut con, "k2", &payload).expect("the module refused what it wrote");
    let keys: Vec<String> = (0..20)
        .map(|n| format!("z{n}"))
        .chain(["k".into(), "k2".into(), "template".into()])
        .collect();
    let before = digests_and_expiries(&mut con, &keys);
    q(&mut con, &argv!["DEBUG", "RELOAD"]);
    assert_eq!(
        digests_and_expiries(&mut con, &keys),
        before,
        "DEBUG RELOAD"
    );
    // More changes on the reloaded value, then a restart from the RDB.
    q(&mut con, &argv!["RL.LEASE", "k", 5, "3650d", "COST", 2]);
    let before = digests_and_expiries(&mut con, &keys);
    server.restart(Shutdown::Save);
    let mut con = server.conn();
    assert_eq!(digests_and_expiries(&mut con, &keys), before, "restart");
    assert_eq!(int(&q(&mut con, &argv!["DBSIZE"])), keys.len() as i64);
}

#[test]
fn a_lease_limiter_holding_more_than_its_limit_is_refused() {
    let (_server, mut con, template) = setup();
    let now = server_time_ms(&mut con) as u64;
    refused(
        &mut con,
        &template,
        &words(7, &[2, now, 1, 9, now + 60_000, 3]),
        "3 slots held under a limit of 2",
    );
    accepted(
        &mut con,
        &template,
        &words(7, &[3, now, 1, 9, now + 60_000, 3]),
        "3 slots held under a limit of 3",
    );
}

#[test]
fn a_lease_longer_than_the_longest_ttl_is_refused() {
    let (_server, mut con, template) = setup();
    let now = server_time_ms(&mut con) as u64;
    refused(
        &mut con,
        &template,
        &words(7, &[2, now, 1, 9, now + 3651 * DAY, 1]),
        "a lease ending 3,651 days after the last change",
    );
    accepted(
        &mut con,
        &template,
        &words(7, &[2, now, 1, 9, now + 3650 * DAY, 1]),
        "a lease ending 3,650 days after the last change",
    );
}

#[test]
fn a_locked_gcra_limiter_whose_tat_precedes_the_lock_is_refused() {
    let (_server, mut con, _) = setup();
    q(&mut con, &argv!["RL.GCRA", "g", 1, 1, "1h"]);
    let denied = array(&q(
        &mut con,
        &argv!["RL.GCRA", "g", 1, 1, "1h", "LOCKOUT", "1h"],
    ))
    .to_vec();
    assert_eq!(int(&denied[0]), 0, "locked by a denial");
    let real = dump(&mut con, "g").expect("g");
    let (start, len) = codec_span(&real);
    let codec = real[start..start + len].to_vec();
    // version, lock marker, until; then the GCRA limiter's own bytes:
    // version, kind, limit, rate, period, interval, TAT high, TAT low.
    assert_eq!((codec[1], codec[11], codec.len()), (6, 5, 60));
    let until = u64::from_le_bytes(codec[2..10].try_into().unwrap());
    let lock_start = until - 3_600_000;
    let with_tat = |tat_ms: u64| {
        let tat = u128::from(tat_ms) * 1_000_000;
        let mut bytes = codec.clone();
        bytes[44..52].copy_from_slice(&((tat >> 64) as u64).to_le_bytes());
        bytes[52..60].copy_from_slice(&(tat as u64).to_le_bytes());
        bytes
    };
    refused(
        &mut con,
        &real,
        &with_tat(lock_start - 20 * 365 * DAY),
        "a TAT 20 years before the lock began",
    );
    accepted(&mut con, &real, &codec, "the real locked limiter");
    accepted(
        &mut con,
        &real,
        &with_tat(lock_start + 1),
        "a TAT after the lock began",
    );
}

/// What replication carries is checked like RESTORE: a grant that does not
/// fit is refused and changes nothing.
#[test]
fn rl_apply_of_a_grant_beyond_the_limit_is_refused() {
    let (_server, mut con, _) = setup();
    q(&mut con, &argv!["RL.LEASE", "l", 3, "1h", "COST", 3]);
    let before = digests_and_expiries(&mut con, &["l".to_string()]);
    let now = server_time_ms(&mut con) as u64;
    let grant = words(0x82, &[3, now, 42, now + 60_000, 1]);
    let mut cmd = to_cmd(&argv!["RL.APPLY", "l"]);
    cmd.arg(grant.as_slice());
    let error = error_of(&raw_cmd(&mut con, &cmd)).expect("refused");
    assert!(
        error.starts_with("ERR") && error.contains("beyond the limit"),
        "{error}"
    );
    assert_eq!(digests_and_expiries(&mut con, &["l".to_string()]), before);
    // The same grant fits a lease limiter of 4 slots.
    let grant = words(0x82, &[4, now, 42, now + 60_000, 1]);
    let mut cmd = to_cmd(&argv!["RL.APPLY", "l"]);
    cmd.arg(grant.as_slice());
    assert_eq!(error_of(&raw_cmd(&mut con, &cmd)), None);
}

/// RESP for one command, as an AOF holds it.
fn resp(argv: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", argv.len()).into_bytes();
    for arg in argv {
        out.extend(format!("${}\r\n", arg.len()).into_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// An AOF written by an earlier version, which accepted RESTOREs that this
/// one refuses: loading it repairs those values (and says so in the log)
/// instead of refusing the file, and every other key loads as it was.
#[test]
fn a_file_holding_what_an_earlier_version_accepted_still_loads() {
    let mut server = Server::start_with(&aof_args("no"));
    let mut con = server.conn();
    q(&mut con, &argv!["CONFIG", "SET", "rdbcompression", "no"]);
    q(&mut con, &argv!["RL.LEASE", "template", 5, "1h"]);
    q(&mut con, &argv!["SET", "plain", "kept"]);
    q(&mut con, &argv!["RL.GCRA", "g", 1, 1, "1h"]);
    q(
        &mut con,
        &argv!["RL.GCRA", "g", 1, 1, "1h", "LOCKOUT", "1h"],
    );
    let template = dump(&mut con, "template").expect("template");
    let real = dump(&mut con, "g").expect("g");
    let now = server_time_ms(&mut con) as u64;
    let (start, len) = codec_span(&real);
    let mut gcra = real[start..start + len].to_vec();
    let until = u64::from_le_bytes(gcra[2..10].try_into().unwrap());
    gcra[44..60].fill(0); // TAT 0: decades before the lock began
    let legacy = [
        ("over", words(7, &[2, now, 1, 9, now + 60_000, 3])),
        ("far", words(7, &[2, now, 1, 9, now + 3651 * DAY, 1])),
        ("behind", gcra),
    ];
    for (_, codec) in &legacy {
        refused(&mut con, &template, codec, "a legacy value at RESTORE");
    }
    server.stop(Shutdown::NoSave);
    let incr = std::fs::read_dir(server.dir().join("appendonlydir"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".incr.aof"))
        .expect("an incremental AOF");
    let mut aof = std::fs::read(&incr).unwrap();
    for (key, codec) in &legacy {
        let payload = dump_with_codec(&template, codec);
        aof.extend(resp(&[b"RESTORE", key.as_bytes(), b"0", &payload]));
    }
    std::fs::write(&incr, aof).unwrap();
    server.restart_with(Shutdown::NoSave, None);
    let mut con = server.conn();
    assert_eq!(string(&q(&mut con, &argv!["GET", "plain"])), "kept");
    for (key, _) in &legacy {
        assert!(exists(&mut con, key), "{key} was not loaded");
        // Repaired into a value this version writes: it DUMPs and RESTOREs.
        let payload = dump(&mut con, key).expect(key);
        restore(&mut con, &format!("{key}:copy"), &payload).expect("strict RESTORE of the repair");
    }
    // The lease limiter keeps its 3 slots (its limit rises to 3), the long
    // lease ends 3650 days after the last change, the lock stays.
    let over = array(&q(&mut con, &argv!["RL.PEEK", "over"])).to_vec();
    assert_eq!((int(&over[1]), int(&over[2])), (3, 0));
    let far = array(&q(&mut con, &argv!["RL.PEEK", "far"])).to_vec();
    let reset = int(&far[4]) as u64;
    assert!(reset <= 3650 * DAY && reset > 3649 * DAY, "{reset}");
    let behind = array(&q(&mut con, &argv!["RL.PEEK", "behind"])).to_vec();
    let reset = int(&behind[4]) as u64;
    assert_eq!(int(&behind[2]), 0, "still locked");
    assert!(
        reset + now <= until + 1000 && reset + now + 60_000 >= until,
        "{reset}"
    );
    let log = server.log_tail(200);
    assert!(
        log.contains("key 'over' held a value no command writes"),
        "no warning in the log:\n{log}"
    );
}
