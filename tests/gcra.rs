//! GCRA: RL.GCRA, RL.THROTTLE and the redis-cell drop-in CL.THROTTLE, against
//! a real server. The generic suites (persistence, replication, cluster,
//! concurrency, bad input, expiry) cover RL.GCRA through `Algo::Gcra`; this
//! file holds what is particular to GCRA and to redis-cell compatibility.

mod common;

use common::*;
use redis::{Connection, Value};
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// CL.THROTTLE's reply: five integers, whatever the protocol.
fn cell(con: &mut Connection, argv: &[String]) -> [i64; 5] {
    cell_reply(&q(con, argv))
}

fn cell_reply(v: &Value) -> [i64; 5] {
    let items = array(v);
    assert_eq!(items.len(), 5, "CL.THROTTLE replies 5 integers: {v:?}");
    let mut out = [0; 5];
    for (slot, item) in out.iter_mut().zip(items) {
        *slot = match item {
            Value::Int(n) => *n,
            other => panic!("not an integer: {other:?} in {v:?}"),
        };
    }
    out
}

/// The examples of redis-cell's README, unchanged, reply by reply.
#[test]
fn redis_cell_readme_examples() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(
        cell(&mut con, &argv!["CL.THROTTLE", "user123", 15, 30, 60, 1]),
        [0, 16, 15, -1, 2]
    );
    let mut other = server.conn();
    assert_eq!(
        cell(&mut other, &argv!["CL.THROTTLE", "user456", 15, 30, 60]),
        [0, 16, 15, -1, 2]
    );
    assert_eq!(
        cell(
            &mut con,
            &argv!["CL.THROTTLE", "user123-read-rate", 15, 30, 60]
        ),
        [0, 16, 15, -1, 2]
    );
    assert_eq!(
        cell(
            &mut con,
            &argv!["CL.THROTTLE", "user123-write-rate", 5, 10, 60]
        ),
        [0, 6, 5, -1, 6]
    );
    // A second request a few ms later: 3.99x s to reset rounds up to 4.
    assert_eq!(
        cell(&mut con, &argv!["CL.THROTTLE", "user123", 15, 30, 60]),
        [0, 16, 14, -1, 4]
    );
    // RESP3 clients get the same array, as from redis-cell.
    let mut resp3 = server.conn_resp3();
    let reply = cell(&mut resp3, &argv!["CL.THROTTLE", "user789", 15, 30, 60]);
    assert_eq!(reply, [0, 16, 15, -1, 2]);
    assert_eq!(string(&q(&mut con, &argv!["TYPE", "user123"])), "ratelimit");
}

/// redis-cell's own test table (limit 5, one per second), the part that
/// happens at one instant: one MULTI sees one clock.
#[test]
fn redis_cell_reference_sequence_at_one_instant() {
    let server = Server::start();
    let mut con = server.conn();
    let call = |quantity: u64| argv!["CL.THROTTLE", "foo", 4, 1, 1, quantity];
    let cmds: Vec<_> = [6, 1, 1, 1, 1, 1, 1, 0].iter().map(|&n| call(n)).collect();
    let (_, items) = timed(&mut con, &cmds);
    let replies: Vec<[i64; 5]> = items.iter().map(cell_reply).collect();
    assert_eq!(
        replies,
        vec![
            [1, 5, 5, -1, 0],
            [0, 5, 4, -1, 1],
            [0, 5, 3, -1, 2],
            [0, 5, 2, -1, 3],
            [0, 5, 1, -1, 4],
            [0, 5, 0, -1, 5],
            [1, 5, 0, 1, 5],
            [0, 5, 0, -1, 5],
        ]
    );
}

/// A quantity-0 call (and RL.GCRA's COST 0 / DRYRUN) reads without writing:
/// no key created, nothing changed, nothing propagated. redis-cell writes.
#[test]
fn peeks_write_nothing() {
    let (primary, _replica) = primary_and_replica(&[]);
    let mut con = primary.conn();
    let offset = repl_offset(&mut con);
    assert_eq!(
        cell(&mut con, &argv!["CL.THROTTLE", "absent", 4, 1, 1, 0]),
        [0, 5, 5, -1, 0]
    );
    let r = rl(&mut con, &argv!["RL.GCRA", "absent", 5, 1, "1s", "COST", 0]);
    assert_eq!((r.allowed, r.remaining, r.reset_after), (true, 5, 0));
    rl(&mut con, &argv!["RL.GCRA", "absent", 5, 1, "1s", "DRYRUN"]);
    assert!(!exists(&mut con, "absent"));
    assert_eq!(repl_offset(&mut con), offset);

    cell(&mut con, &argv!["CL.THROTTLE", "k", 4, 1, 60, 2]);
    let before = key_state(&mut con, "k");
    let offset = repl_offset(&mut con);
    let peek = cell(&mut con, &argv!["CL.THROTTLE", "k", 4, 1, 60, 0]);
    assert_eq!(&peek[..3], &[0, 5, 3]);
    rl(&mut con, &argv!["RL.THROTTLE", "k", 4, 1, 60, 0]);
    assert_eq!(key_state(&mut con, "k"), before);
    assert_eq!(repl_offset(&mut con), offset);
}

/// One stored limiter, three commands: what CL.THROTTLE consumed, RL.GCRA
/// and RL.THROTTLE see, and RL.PEEK reports; other algorithms are refused.
#[test]
fn one_limiter_three_commands() {
    let server = Server::start();
    let mut con = server.conn();
    cell(&mut con, &argv!["CL.THROTTLE", "shared", 4, 1, 3600]);
    cell(&mut con, &argv!["CL.THROTTLE", "shared", 4, 1, 3600]);
    let peek = Reply::parse(&q(&mut con, &argv!["RL.PEEK", "shared"]));
    assert_eq!((peek.limit, peek.remaining), (5, 3));
    let r = rl(&mut con, &argv!["RL.GCRA", "shared", 5, 1, "1h"]);
    assert_eq!((r.allowed, r.limit, r.remaining), (true, 5, 2));
    let r = rl(&mut con, &argv!["RL.THROTTLE", "shared", 4, 1, "1h"]);
    assert_eq!((r.allowed, r.limit, r.remaining), (true, 5, 1));
    let reply = cell(&mut con, &argv!["CL.THROTTLE", "shared", 4, 1, 3600, 2]);
    assert_eq!(&reply[..4], &[1, 5, 1, 3600]);
    assert_eq!(string(&q(&mut con, &argv!["TYPE", "shared"])), "ratelimit");

    let e = q_err(&mut con, &argv!["RL.WINDOW", "shared", 5, "1h"]);
    assert_eq!(
        e,
        "WRONGTYPE key holds a GCRA limiter (RL.GCRA, RL.THROTTLE, CL.THROTTLE), not a fixed window (RL.WINDOW)"
    );
    rl(&mut con, &argv!["RL.TOKENBUCKET", "bucket", 5, 1, "1h"]);
    for cmd in [
        argv!["CL.THROTTLE", "bucket", 4, 1, 3600],
        argv!["RL.GCRA", "bucket", 5, 1, "1h"],
        argv!["RL.THROTTLE", "bucket", 4, 1, 3600],
    ] {
        let e = q_err(&mut con, &cmd);
        assert!(e.starts_with("WRONGTYPE key holds a token bucket"), "{e}");
    }
    q(&mut con, &argv!["SET", "str", "x"]);
    let e = q_err(&mut con, &argv!["CL.THROTTLE", "str", 4, 1, 3600]);
    assert!(e.starts_with("WRONGTYPE Operation against a key"), "{e}");
}

/// RL.THROTTLE key max_burst ... is RL.GCRA key (max_burst + 1) ...: the
/// same replies and the same stored state.
#[test]
fn rl_throttle_is_rl_gcra_with_one_more() {
    let server = Server::start();
    let mut con = server.conn();
    for quantity in [1, 3, 0, 2, 9, 1, 1] {
        let (_, items) = timed(
            &mut con,
            &[
                argv!["RL.THROTTLE", "a", 4, 3, "1s", quantity],
                argv!["RL.GCRA", "b", 5, 3, "1s", "COST", quantity],
            ],
        );
        assert_eq!(Reply::parse(&items[0]), Reply::parse(&items[1]));
        assert_eq!(digest(&mut con, "a"), digest(&mut con, "b"));
    }
}

/// Waiting the advertised time is enough: RL.GCRA in milliseconds,
/// CL.THROTTLE in (rounded-up) seconds.
#[test]
fn retry_after_then_allowed() {
    let server = Server::start();
    let mut con = server.conn();
    let cmd = argv!["RL.GCRA", "fast", 2, 10, "1s"];
    assert!(rl(&mut con, &cmd).allowed && rl(&mut con, &cmd).allowed);
    let denied = rl(&mut con, &cmd);
    assert!(!denied.allowed && (1..=100).contains(&denied.retry_after));
    sleep(Duration::from_millis(denied.retry_after as u64 + 2));
    assert!(rl(&mut con, &cmd).allowed);

    let cmd = argv!["CL.THROTTLE", "slow", 0, 1, 1];
    assert_eq!(cell(&mut con, &cmd)[0], 0);
    let denied = cell(&mut con, &cmd);
    assert_eq!((denied[0], denied[3]), (1, 1), "{denied:?}");
    sleep(Duration::from_secs(denied[3] as u64));
    assert_eq!(cell(&mut con, &cmd)[0], 0);
}

/// Rates redis-cell gets wrong: above 10^6 per second it divides by zero.
#[test]
fn high_rates_are_exact() {
    let server = Server::start();
    let mut con = server.conn();
    // 10^6 per second, burst 10^6: half of it at once.
    let r = cell(
        &mut con,
        &argv!["CL.THROTTLE", "m", 999_999, 1_000_000, 1, 500_000],
    );
    assert_eq!(r, [0, 1_000_000, 500_000, -1, 1]);
    // 10^9 per second (one per nanosecond).
    let r = cell(
        &mut con,
        &argv![
            "CL.THROTTLE",
            "g",
            999_999_999,
            1_000_000_000,
            1,
            400_000_000
        ],
    );
    assert_eq!(r, [0, 1_000_000_000, 600_000_000, -1, 1]);
    let (t, items) = timed(
        &mut con,
        &[argv![
            "RL.GCRA",
            "n",
            1_000_000_000,
            1_000_000_000,
            "1s",
            "COST",
            1_000_000_000
        ]],
    );
    let r = Reply::parse(&items[0]);
    assert_eq!((r.allowed, r.remaining, r.reset_after), (true, 0, 1000));
    // Exactly 10^6 back per millisecond.
    sleep_until_server_ms(&mut con, t + 5);
    let (t2, items) = timed(
        &mut con,
        &[argv![
            "RL.GCRA",
            "n",
            1_000_000_000,
            1_000_000_000,
            "1s",
            "COST",
            0
        ]],
    );
    assert_eq!(
        Reply::parse(&items[0]).remaining,
        (t2 - t) * 1_000_000,
        "at +{} ms",
        t2 - t
    );
    let e = q_err(&mut con, &argv!["RL.GCRA", "n2", 1, 1_000_000_001, "1s"]);
    assert!(e.contains("one request per nanosecond"), "{e}");
    // Periods below a second, which redis-cell cannot express.
    let r = cell(&mut con, &argv!["CL.THROTTLE", "ms", 0, 1, "250ms"]);
    assert_eq!(r, [0, 1, 0, -1, 1]);
    let r = cell(&mut con, &argv!["CL.THROTTLE", "ms", 0, 1, "250ms"]);
    assert_eq!((r[0], r[3]), (1, 1));
}

/// Every bad argument of RL.THROTTLE and CL.THROTTLE: an error naming it,
/// nothing written, nothing propagated.
#[test]
fn bad_throttle_arguments_change_nothing() {
    let (primary, _replica) = primary_and_replica(&[]);
    let mut con = primary.conn();
    cell(&mut con, &argv!["CL.THROTTLE", "k", 4, 1, 3600, 2]);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["-1", "1", "1"],
            "ERR max_burst must be an integer from 0 to 999999999999999",
        ),
        (vec!["x", "1", "1"], "ERR max_burst must be"),
        (vec!["1000000000000000", "1", "1"], "ERR max_burst must be"),
        (
            vec!["4", "0", "1"],
            "ERR count_per_period must be an integer from 1",
        ),
        (vec!["4", "1.5", "1"], "ERR count_per_period must be"),
        (vec!["4", "1", "0"], "ERR period must be a duration"),
        (vec!["4", "1", "-1"], "ERR period must be a duration"),
        (vec!["4", "1", "1.5"], "ERR period must be a duration"),
        (
            vec!["4", "1", "1", "-1"],
            "ERR quantity must be an integer from 0",
        ),
        (
            vec!["4", "1", "1", "1000000000000001"],
            "ERR quantity must be",
        ),
        (vec!["4", "1", "1", "COST"], "ERR quantity must be"),
        (
            vec!["4", "1", "1", "1", "1"],
            "ERR wrong number of arguments: ",
        ),
        (
            vec!["4", "2000000000", "1"],
            "ERR the rate must be at most one request per nanosecond",
        ),
        (
            vec!["999999999999999", "1", "3650d"],
            "ERR (max_burst + 1) x period / rate must stay below 2^94 ns",
        ),
    ];
    let mut checked = 0;
    for command in ["CL.THROTTLE", "RL.THROTTLE"] {
        for key in ["k", "absent"] {
            let arity = argv![command, key, 4, 1];
            let e = q_err(&mut con, &arity);
            assert_eq!(
                e,
                format!(
                    "ERR wrong number of arguments for '{}' command",
                    command.to_lowercase()
                )
            );
            for (args, prefix) in &cases {
                let mut cmd = argv![command, key];
                cmd.extend(args.iter().map(|s| s.to_string()));
                let state = key_state(&mut con, key);
                let offset = repl_offset(&mut con);
                let e = q_err(&mut con, &cmd);
                assert!(e.starts_with(prefix), "{cmd:?}: {e}");
                assert_eq!(key_state(&mut con, key), state, "{cmd:?}");
                assert_eq!(repl_offset(&mut con), offset, "{cmd:?}");
                checked += 1;
            }
        }
    }
    assert!(!exists(&mut con, "absent"));
    assert_eq!(checked, 2 * 2 * cases.len());
}

/// Random CL.THROTTLE, RL.THROTTLE and RL.GCRA traffic: the replica holds
/// the same limiters (digest, expiry), and so does the primary after DEBUG
/// RELOAD and DUMP/RESTORE.
#[test]
fn replicas_and_reloads_keep_gcra_state() {
    let (primary, replica) = primary_and_replica(&[]);
    let mut con = primary.conn();
    let mut next = xorshift(0x9e37_79b9_u64);
    for _ in 0..600 {
        let key = format!("g:{}", next() % 12);
        let n = next();
        let quantity = n % 4;
        let cmd = match n % 3 {
            // Long periods: no key expires while the test compares them.
            0 => argv!["CL.THROTTLE", key, 3, 7, 7200, quantity],
            1 => argv!["RL.THROTTLE", key, 3, 7, "2h", quantity],
            _ => argv!["RL.GCRA", key, 4, 7, "2h", "COST", quantity],
        };
        let _ = q(&mut con, &cmd);
    }
    sync_replica(&primary, &replica);
    let mut rcon = replica.conn();
    let keys: Vec<String> = (0..12).map(|i| format!("g:{i}")).collect();
    let states = digests_and_expiries(&mut con, &keys);
    let on_replica = digests_and_expiries(&mut rcon, &keys);
    for ((key, state), replicated) in keys.iter().zip(&states).zip(&on_replica) {
        assert_eq!(replicated, state, "{key}");
        if let Some(payload) = dump(&mut con, key) {
            q(&mut con, &argv!["DEL", "copy"]);
            // With the same expiry: a key's digest includes whether it has one.
            let cmd = redis::cmd("RESTORE")
                .arg("copy")
                .arg(state.1)
                .arg(payload)
                .arg("ABSTTL")
                .clone();
            raw_cmd(&mut con, &cmd);
            assert_eq!(digest(&mut con, "copy"), state.0, "{key} via DUMP/RESTORE");
        }
    }
    q(&mut con, &argv!["DEL", "copy"]);
    q(&mut con, &argv!["DEBUG", "RELOAD"]);
    assert_eq!(
        digests_and_expiries(&mut con, &keys),
        states,
        "after DEBUG RELOAD"
    );
}

#[test]
fn cl_throttle_declares_its_key() {
    let server = Server::start();
    let mut con = server.conn();
    for name in ["CL.THROTTLE", "RL.THROTTLE"] {
        let keys = q(
            &mut con,
            &argv!["COMMAND", "GETKEYS", name, "the-key", 1, 1, 1],
        );
        assert_eq!(array(&keys).len(), 1);
        assert_eq!(string(&array(&keys)[0]), "the-key");
    }
    let keys = q(
        &mut con,
        &argv!["COMMAND", "GETKEYS", "RL.GCRA", "k2", 1, 1, 1],
    );
    assert_eq!(string(&array(&keys)[0]), "k2");
}

/// `cl-throttle no` leaves the name free; RL.GCRA and RL.THROTTLE stay.
#[test]
fn load_argument_turns_the_alias_off() {
    let server = Server::start_with(&["cl-throttle", "no"]);
    let mut con = server.conn();
    let e = q_err(&mut con, &argv!["CL.THROTTLE", "k", 1, 1, 1]);
    assert!(e.starts_with("ERR unknown command"), "{e}");
    rl(&mut con, &argv!["RL.GCRA", "k", 1, 1, "1s"]);
    rl(&mut con, &argv!["RL.THROTTLE", "k2", 1, 1, 1]);
}

/// A bad module argument refuses the load, saying why.
#[test]
fn bad_load_argument_refuses_to_load() {
    let dir = TempDir::new("valkey-rl-loadarg");
    let mut child = Command::new(server_binary())
        .args(["--port", "0", "--save", "", "--dir"])
        .arg(&dir.path)
        .arg("--loadmodule")
        .arg(module_path())
        .args(["cl-throttle", "maybe"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn valkey-server");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the server started despite a bad module argument");
        }
        sleep(Duration::from_millis(20));
    };
    assert!(!status.success());
    let output = child.wait_with_output().expect("output");
    let text = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(
        text.contains("module argument cl-throttle must be yes or no, not 'maybe'"),
        "{text}"
    );
}

/// With redis-cell loaded first (CELL_MODULE=/path/libredis_cell.so), the
/// module loads, warns, and leaves CL.THROTTLE to redis-cell.
#[test]
fn name_taken_by_redis_cell_skips_only_the_alias() {
    let Some(cell_module) = std::env::var_os("CELL_MODULE") else {
        eprintln!("skipped: set CELL_MODULE=/path/to/libredis_cell.so to run this test");
        return;
    };
    let cell_module = cell_module.to_string_lossy().to_string();
    let server = Server::start_with_first(&["--loadmodule", &cell_module], &[]);
    let mut con = server.conn();
    let modules = format!("{:?}", q(&mut con, &argv!["MODULE", "LIST"]));
    assert!(
        modules.contains("redis-cell") && modules.contains("ratelimit"),
        "{modules}"
    );
    assert!(
        server.log_tail(200).contains("CL.THROTTLE is skipped"),
        "{}",
        server.log_tail(50)
    );
    // redis-cell answers CL.THROTTLE: it stores a plain string.
    cell(&mut con, &argv!["CL.THROTTLE", "c", 1, 1, 1]);
    assert_eq!(string(&q(&mut con, &argv!["TYPE", "c"])), "string");
    rl(&mut con, &argv!["RL.GCRA", "g", 1, 1, "1s"]);
}
