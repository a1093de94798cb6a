//! State survives DEBUG RELOAD, RDB and AOF restarts, AOF rewrites, DUMP/RESTORE
//! and COPY, for every algorithm; corrupted RESTORE payloads are refused or
//! produce a usable limiter, never a crash.

mod common;

use common::*;
use redis::{Connection, Value};
use std::thread::sleep;
use std::time::Duration;

/// The keys `populate` writes, each with the command that owns it.
fn limiters() -> Vec<(String, Vec<String>)> {
    vec![
        ("tb".into(), argv!["RL.TOKENBUCKET", "tb", 10, 1, "1h"]),
        (
            "tb:odd".into(),
            argv!["RL.TOKENBUCKET", "tb:odd", 7, 3, "13h"],
        ),
        (
            "tb:big".into(),
            argv!["RL.TOKENBUCKET", "tb:big", MAX_COUNT, 7, "3650d"],
        ),
        ("fw".into(), argv!["RL.WINDOW", "fw", 10, "1h"]),
        (
            "fw:day".into(),
            argv!["RL.WINDOW", "fw:day", 1_000_000, "1d"],
        ),
        ("sw".into(), argv!["RL.WINDOW", "sw", 10, "1h", "SLIDING"]),
        ("sl".into(), argv!["RL.SLIDINGLOG", "sl", 10, "1h"]),
        (
            "sl:big".into(),
            argv!["RL.SLIDINGLOG", "sl:big", 100_000, "1h"],
        ),
        (
            "sl:counted".into(),
            argv!["RL.SLIDINGLOG", "sl:counted", 3, "1h", "COUNTDENIED"],
        ),
    ]
}

fn with(cmd: &[String], options: &[&str]) -> Vec<String> {
    let mut cmd = cmd.to_vec();
    cmd.extend(options.iter().map(|s| s.to_string()));
    cmd
}

/// Writes every limiter of `limiters()`; the big log gets `entries` entries
/// at distinct milliseconds.
fn populate(con: &mut Connection, entries: usize) {
    avoid_boundary(con, ONE_HOUR_MS, 120_000);
    for (key, cmd) in limiters() {
        match key.as_str() {
            "sl:big" => {
                for i in 0..entries {
                    rl(con, &with(&cmd, &["COST", &(1 + i % 3).to_string()]));
                    sleep(Duration::from_millis(1));
                }
            }
            "sl:counted" => {
                for _ in 0..6 {
                    rl(con, &cmd);
                    sleep(Duration::from_millis(2));
                }
            }
            "tb:odd" => {
                rl(con, &with(&cmd, &["COST", "5"]));
            }
            "tb:big" => {
                rl(con, &with(&cmd, &["COST", "123456789012345"]));
            }
            _ => {
                rl(con, &with(&cmd, &["COST", "3"]));
                rl(con, &cmd);
            }
        }
    }
}

/// What must survive: TYPE, digest and absolute expiry of each key, and what
/// a DRYRUN would answer (minus the times, which move on).
#[derive(Debug, PartialEq, Eq)]
struct Snap {
    key: String,
    kind: String,
    digest: String,
    expire_at: i64,
    dry: (bool, i64, i64),
}

fn snapshot(con: &mut Connection) -> Vec<Snap> {
    limiters()
        .into_iter()
        .map(|(key, cmd)| {
            let state = key_state(con, &key);
            assert!(state.exists, "{key} missing");
            let r = rl(con, &with(&cmd, &["DRYRUN"]));
            Snap {
                key,
                kind: state.kind,
                digest: state.digest,
                expire_at: state.expire_at,
                dry: (r.allowed, r.limit, r.remaining),
            }
        })
        .collect()
}

fn assert_same(before: &[Snap], after: &[Snap], what: &str) {
    for (b, a) in before.iter().zip(after) {
        assert_eq!(b, a, "{what}: {} changed", b.key);
    }
}

/// The digests are not trivially equal: they tell states apart.
#[test]
fn digest_reflects_state() {
    let server = Server::start();
    let mut con = server.conn();
    populate(&mut con, 20);
    let snap = snapshot(&mut con);
    for (i, a) in snap.iter().enumerate() {
        assert_ne!(a.digest, "0".repeat(40), "{}: zero digest", a.key);
        for b in &snap[i + 1..] {
            assert_ne!(
                a.digest, b.digest,
                "{} and {} have the same digest",
                a.key, b.key
            );
        }
    }
    for (key, cmd) in limiters() {
        let before = digest(&mut con, &key);
        let r = rl(&mut con, &cmd);
        if r.allowed {
            assert_ne!(
                digest(&mut con, &key),
                before,
                "{key}: an allowed request did not change the digest"
            );
        }
    }
}

#[test]
fn debug_reload_keeps_state() {
    let server = Server::start();
    let mut con = server.conn();
    populate(&mut con, 300);
    let before = snapshot(&mut con);
    q(&mut con, &argv!["DEBUG", "RELOAD"]);
    assert_same(&before, &snapshot(&mut con), "DEBUG RELOAD");
    // And again, with the reloaded state.
    q(&mut con, &argv!["DEBUG", "RELOAD"]);
    assert_same(&before, &snapshot(&mut con), "second DEBUG RELOAD");
}

/// A sliding window counter holding a previous window's count survives
/// DEBUG RELOAD, DUMP/RESTORE and COPY.
#[test]
fn sliding_window_with_previous_count_round_trips() {
    let server = Server::start();
    let mut con = server.conn();
    let period = 2000;
    let cmd = argv!["RL.WINDOW", "swp", 10, format!("{period}ms"), "SLIDING"];
    let now = server_time_ms(&mut con);
    let edge = (now / period + 1) * period;
    sleep_until_server_ms(&mut con, edge + 10);
    let (t1, r1) = timed_rl(&mut con, &with(&cmd, &["COST", "6"]));
    assert!(r1.allowed);
    sleep_until_server_ms(&mut con, (t1 / period + 1) * period + 10);
    let (t2, r2) = timed_rl(&mut con, &with(&cmd, &["COST", "1"]));
    assert!(t2 / period == t1 / period + 1, "timing: {t1} then {t2}");
    let elapsed = t2 % period;
    let expect_remaining = (10 * period - 6 * (period - elapsed) - period) / period;
    assert!(
        r2.allowed && r2.remaining == expect_remaining,
        "previous 6 weighs: {r2:?} at {elapsed} ms"
    );
    let items = exec(
        &mut con,
        &[
            argv!["DEBUG", "DIGEST-VALUE", "swp"],
            argv!["PEXPIRETIME", "swp"],
            argv!["DUMP", "swp"],
            with(&cmd, &["DRYRUN"]),
        ],
    );
    let before_digest = string(&array(&items[0])[0]);
    let expire_at = int(&items[1]);
    let Value::BulkString(payload) = &items[2] else {
        panic!("DUMP: {:?}", items[2])
    };
    let dry = Reply::parse(&items[3]);
    assert_eq!(
        expire_at,
        (t2 / period + 1) * period + period,
        "counted requests weigh until the next window ends"
    );

    let mut restore = redis::cmd("RESTORE");
    restore
        .arg("swp:restored")
        .arg(expire_at)
        .arg(payload.as_slice())
        .arg("ABSTTL");
    assert_eq!(raw_cmd(&mut con, &restore), Value::Okay);
    q(&mut con, &argv!["COPY", "swp", "swp:copy"]);
    q(&mut con, &argv!["DEBUG", "RELOAD"]);
    for key in ["swp", "swp:restored", "swp:copy"] {
        let (t, items) = timed(
            &mut con,
            &[
                argv!["DEBUG", "DIGEST-VALUE", key],
                argv!["PEXPIRETIME", key],
                argv![
                    "RL.WINDOW",
                    key,
                    10,
                    format!("{period}ms"),
                    "SLIDING",
                    "DRYRUN"
                ],
            ],
        );
        assert_eq!(string(&array(&items[0])[0]), before_digest, "{key}");
        assert_eq!(int(&items[1]), expire_at, "{key}");
        let r = Reply::parse(&items[2]);
        assert!(r.remaining >= dry.remaining, "{key}: {r:?} vs {dry:?}");
        if t / period == t2 / period {
            assert!(r.remaining < 9, "{key}: the previous count was lost: {r:?}");
        }
    }
}

#[test]
fn rdb_restart_keeps_state() {
    let mut server = Server::start();
    let mut con = server.conn();
    populate(&mut con, 300);
    let before = snapshot(&mut con);
    drop(con);
    server.restart(Shutdown::Save);
    let mut con = server.conn();
    assert_same(&before, &snapshot(&mut con), "SHUTDOWN SAVE + restart");
    // BGSAVE too.
    q(&mut con, &argv!["BGSAVE"]);
    wait_for(&mut con, "persistence", "rdb_bgsave_in_progress", "0");
    drop(con);
    server.restart(Shutdown::NoSave);
    let mut con = server.conn();
    assert_same(&before, &snapshot(&mut con), "BGSAVE + restart");
}

fn aof_restart(preamble: &str) {
    let mut server = Server::start_with(&aof_args(preamble));
    let mut con = server.conn();
    wait_for_rewrite(&mut con);
    populate(&mut con, 300);
    let before = snapshot(&mut con);
    drop(con);
    server.restart(Shutdown::NoSave);
    let mut con = server.conn();
    assert_same(
        &before,
        &snapshot(&mut con),
        &format!("AOF (preamble {preamble}) restart"),
    );
}

#[test]
fn aof_restart_without_preamble() {
    aof_restart("no");
}

#[test]
fn aof_restart_with_preamble() {
    aof_restart("yes");
}

fn aof_rewrite_restart(preamble: &str) {
    let mut server = Server::start_with(&aof_args(preamble));
    let mut con = server.conn();
    wait_for_rewrite(&mut con);
    populate(&mut con, 300);
    q(&mut con, &argv!["BGREWRITEAOF"]);
    wait_for_rewrite(&mut con);
    // More traffic after the rewrite lands in the new incremental file.
    for (key, cmd) in limiters() {
        if key != "sl:big" {
            rl(&mut con, &cmd);
        }
    }
    rl(
        &mut con,
        &argv!["RL.SLIDINGLOG", "sl:big", 100_000, "1h", "COST", 7],
    );
    let before = snapshot(&mut con);
    drop(con);
    server.restart(Shutdown::NoSave);
    let mut con = server.conn();
    assert_same(
        &before,
        &snapshot(&mut con),
        &format!("BGREWRITEAOF (preamble {preamble}) + restart"),
    );
    // A rewrite of the loaded state, then another restart.
    q(&mut con, &argv!["BGREWRITEAOF"]);
    wait_for_rewrite(&mut con);
    drop(con);
    server.restart(Shutdown::NoSave);
    let mut con = server.conn();
    assert_same(
        &before,
        &snapshot(&mut con),
        &format!("second rewrite (preamble {preamble}) + restart"),
    );
}

#[test]
fn aof_rewrite_without_preamble() {
    aof_rewrite_restart("no");
}

#[test]
fn aof_rewrite_with_preamble() {
    aof_rewrite_restart("yes");
}

/// An RDB written by one server loads into another with AOF off and back.
#[test]
fn switching_from_rdb_to_aof_keeps_state() {
    let mut server = Server::start();
    let mut con = server.conn();
    populate(&mut con, 100);
    let before = snapshot(&mut con);
    // CONFIG SET appendonly yes writes the AOF from the current data set.
    q(
        &mut con,
        &argv!["CONFIG", "SET", "aof-use-rdb-preamble", "no"],
    );
    q(&mut con, &argv!["CONFIG", "SET", "appendonly", "yes"]);
    wait_for_rewrite(&mut con);
    wait_for(&mut con, "persistence", "aof_enabled", "1");
    drop(con);
    server.restart_with(
        Shutdown::NoSave,
        Some(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]),
    );
    let mut con = server.conn();
    assert_same(
        &before,
        &snapshot(&mut con),
        "AOF created by CONFIG SET appendonly yes",
    );
}

#[test]
fn dump_restore_and_copy_give_equal_limiters() {
    let server = Server::start();
    let mut con = server.conn();
    populate(&mut con, 300);
    for (key, cmd) in limiters() {
        let state = key_state(&mut con, &key);
        let payload = state.dump.clone().expect("DUMP");
        // RESTORE with the same absolute expiry: equal digest.
        let target = format!("{key}:restored");
        let mut restore = redis::cmd("RESTORE");
        restore
            .arg(&target)
            .arg(state.expire_at)
            .arg(payload.as_slice())
            .arg("ABSTTL");
        assert_eq!(raw_cmd(&mut con, &restore), Value::Okay, "RESTORE {key}");
        assert_eq!(digest(&mut con, &target), state.digest, "RESTORE of {key}");
        assert_eq!(pexpiretime(&mut con, &target), state.expire_at);
        assert_eq!(string(&q(&mut con, &argv!["TYPE", &target])), "ratelimit");
        // RESTORE into an existing key needs REPLACE.
        let mut again = redis::cmd("RESTORE");
        again.arg(&target).arg(0).arg(payload.as_slice());
        let v = raw_cmd(&mut con, &again);
        let e = error_of(&v).unwrap_or_else(|| panic!("RESTORE over an existing key: {v:?}"));
        assert!(e.starts_with("BUSYKEY"), "{e}");
        // COPY: equal, and independent afterwards.
        let copy = format!("{key}:copy");
        assert_eq!(int(&q(&mut con, &argv!["COPY", &key, &copy])), 1);
        assert_eq!(digest(&mut con, &copy), state.digest, "COPY of {key}");
        assert_eq!(pexpiretime(&mut con, &copy), state.expire_at);
        let mut copy_cmd = cmd.clone();
        copy_cmd[1] = copy.clone();
        let r = rl(&mut con, &with(&copy_cmd, &["COST", "2"]));
        if r.allowed {
            assert_ne!(
                digest(&mut con, &copy),
                state.digest,
                "{copy} did not change"
            );
        }
        assert_eq!(
            digest(&mut con, &key),
            state.digest,
            "writing {copy} changed {key}"
        );
        // The restored limiter behaves like the original.
        let mut restored_cmd = cmd.clone();
        restored_cmd[1] = target.clone();
        let items = exec(
            &mut con,
            &[with(&cmd, &["DRYRUN"]), with(&restored_cmd, &["DRYRUN"])],
        );
        assert_eq!(
            Reply::parse(&items[0]),
            Reply::parse(&items[1]),
            "{key} vs {target}"
        );
    }
}

/// Our CRC64 matches the server's (so crafted payloads below are well formed).
#[test]
fn crc64_matches_dump_payloads() {
    assert_eq!(crc64(b"123456789"), 0xe9c6_d914_c4b8_d9ca);
    let server = Server::start();
    let mut con = server.conn();
    q(&mut con, &argv!["SET", "s", "hello"]);
    rl(&mut con, &argv!["RL.TOKENBUCKET", "tb", 5, 1, "1h"]);
    for key in ["s", "tb"] {
        let payload = dump(&mut con, key).unwrap();
        let mut fixed = payload.clone();
        fix_dump_crc(&mut fixed);
        assert_eq!(fixed, payload, "CRC of DUMP {key}");
    }
}

/// After a mutated payload was accepted: the key must be a usable limiter.
fn exercise(con: &mut Connection, key: &str, what: &str) {
    assert_eq!(string(&q(con, &argv!["TYPE", key])), "ratelimit", "{what}");
    digest(con, key);
    q(con, &argv!["MEMORY", "USAGE", key]);
    dump(con, key);
    let mut worked = 0;
    for algo in Algo::ALL {
        for options in [
            &["DRYRUN"][..],
            &["COST", "0"][..],
            &[][..],
            &["COST", "5"][..],
        ] {
            match try_q(con, &algo.cmd_with(key, 7, "1h", options)) {
                Ok(v) => {
                    Reply::parse(&v);
                    worked += 1;
                }
                Err(e) => assert!(
                    e.starts_with("WRONGTYPE"),
                    "{what}: {algo:?} {options:?}: {e}"
                ),
            }
        }
    }
    assert!(worked > 0, "{what}: accepted a state no command can use");
    q(con, &argv!["DEL", key]);
}

#[test]
fn corrupted_restore_payloads_are_refused_or_harmless() {
    let mut server = Server::start();
    let mut con = server.conn();
    populate(&mut con, 40);
    // A flipped byte without a matching CRC: refused by the server itself.
    let payload = dump(&mut con, "tb").unwrap();
    let mut flipped = payload.clone();
    flipped[payload.len() / 2] ^= 0x55;
    let mut restore = redis::cmd("RESTORE");
    restore.arg("bad").arg(0).arg(flipped.as_slice());
    let v = raw_cmd(&mut con, &restore);
    let e = error_of(&v).unwrap_or_else(|| panic!("a payload with a bad CRC was accepted: {v:?}"));
    assert!(e.contains("checksum"), "{e}");
    // Well-formed payloads (right CRC) with the module's bytes mutated or cut.
    let mut accepted = 0;
    let mut refused = 0;
    for (key, _) in limiters() {
        let payload = dump(&mut con, &key).unwrap();
        let body = payload.len() - 10; // then 2 bytes RDB version and 8 bytes CRC
        let mut variants: Vec<Vec<u8>> = Vec::new();
        let step = if body > 200 { 7 } else { 1 };
        for i in (1..body).step_by(step) {
            for x in [0x01u8, 0x10, 0x80, 0xff] {
                let mut v = payload.clone();
                v[i] ^= x;
                variants.push(v);
            }
        }
        for cut in (1..body).step_by(step) {
            let mut v = payload[..cut].to_vec();
            v.extend_from_slice(&payload[body..]);
            variants.push(v);
        }
        // Extra bytes after the value.
        let mut v = payload[..body].to_vec();
        v.extend_from_slice(&[0, 0, 0]);
        v.extend_from_slice(&payload[body..]);
        variants.push(v);
        for (n, mut v) in variants.into_iter().enumerate() {
            fix_dump_crc(&mut v);
            let target = format!("mut:{key}:{n}");
            let mut restore = redis::cmd("RESTORE");
            restore.arg(&target).arg(0).arg(v.as_slice());
            match raw_cmd(&mut con, &restore) {
                Value::ServerError(_) => {
                    refused += 1;
                    assert!(
                        !exists(&mut con, &target),
                        "a refused RESTORE created {target}"
                    );
                }
                Value::Okay => {
                    accepted += 1;
                    exercise(&mut con, &target, &format!("{key} variant {n}"));
                }
                other => panic!("RESTORE replied {other:?}"),
            }
            if n % 200 == 0 {
                server.assert_alive();
            }
        }
    }
    eprintln!("mutated payloads: {refused} refused, {accepted} accepted");
    server.assert_alive();
    // What is left still saves and loads.
    q(&mut con, &argv!["DEBUG", "RELOAD"]);
    server.assert_alive();
}

/// A limiter restored without a TTL (or PERSISTed) gets its computed expiry
/// back at its next write, so an AOF rewrite (which replays through the
/// same expiry rule) reproduces the live key exactly.
#[test]
fn a_write_restores_the_computed_expiry() {
    let server = Server::start();
    let mut con = server.conn();
    rl(&mut con, &argv!["RL.WINDOW", "w", 10, "1h"]);
    q(&mut con, &argv!["PERSIST", "w"]);
    assert_eq!(int(&q(&mut con, &argv!["PTTL", "w"])), -1);
    let r = rl(&mut con, &argv!["RL.WINDOW", "w", 10, "1h"]);
    let pttl = int(&q(&mut con, &argv!["PTTL", "w"]));
    assert!(
        pttl > 0 && pttl <= r.reset_after,
        "pttl {pttl}, reply {r:?}"
    );
}
