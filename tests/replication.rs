//! A replica reaches exactly the primary's state, through RL.APPLY only.

mod common;

use common::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use redis::Connection;

const KEYS: usize = 50;

/// Key i's algorithm is fixed: i % 4.
fn algo_of(i: usize) -> Algo {
    Algo::ALL[i % Algo::ALL.len()]
}

fn random_call(rng: &mut StdRng) -> Vec<String> {
    let i = rng.gen_range(0..KEYS);
    let key = format!("rk:{i}");
    let algo = algo_of(i);
    // Mostly one parameter set per key, sometimes another (state carries over).
    let (limit, period) = match rng.gen_range(0..10) {
        0 => (
            rng.gen_range(1..40u64),
            ["1h", "2h", "90m"][rng.gen_range(0..3)],
        ),
        _ => (10 + (i as u64 % 7), "1h"),
    };
    let mut cmd = match algo {
        Algo::TokenBucket => argv!["RL.TOKENBUCKET", &key, limit, rng.gen_range(1..5), period],
        _ => algo.cmd(&key, limit, period),
    };
    // Options as groups, in random order.
    let mut options: Vec<Vec<String>> = Vec::new();
    match rng.gen_range(0..10) {
        0 => options.push(argv!["COST", 0]),
        1..=3 => options.push(argv!["cost", rng.gen_range(1..=limit + 2)]),
        _ => {}
    }
    if rng.gen_bool(0.1) {
        options.push(argv!["DRYRUN"]);
    }
    if algo == Algo::SlidingLog && rng.gen_bool(0.3) {
        options.push(argv!["COUNTDENIED"]);
    }
    if algo == Algo::SlidingWindow {
        // algo.cmd put SLIDING last; move it among the options.
        cmd.pop();
        options.push(argv!["sliding"]);
    }
    options.shuffle(rng);
    cmd.extend(options.into_iter().flatten());
    cmd
}

/// The random traffic uses windows of 1h, 2h and 90m: keep clear of their
/// edges, where fixed windows expire (a key expiring between the primary's
/// and the replica's digest would be a false alarm).
fn avoid_window_edges(con: &mut Connection) {
    for period in [ONE_HOUR_MS, 2 * ONE_HOUR_MS, 90 * 60_000] {
        avoid_boundary(con, period, 120_000);
    }
}

fn drive(con: &mut Connection, rng: &mut StdRng, calls: usize) {
    let mut done = 0;
    while done < calls {
        match rng.gen_range(0..20) {
            // A MULTI/EXEC of a few calls.
            0 => {
                let cmds: Vec<Vec<String>> =
                    (0..rng.gen_range(2..6)).map(|_| random_call(rng)).collect();
                for item in exec(con, &cmds) {
                    Reply::parse(&item);
                }
                done += cmds.len();
            }
            // A script.
            1 => {
                let cmd = random_call(rng);
                let script = "return server.call(ARGV[1], KEYS[1], unpack(ARGV, 2))";
                let mut eval = argv!["EVAL", script, 1, &cmd[1], &cmd[0]];
                eval.extend(cmd[2..].iter().cloned());
                Reply::parse(&q(con, &eval));
                done += 1;
            }
            _ => {
                let cmd = random_call(rng);
                Reply::parse(&q(con, &cmd));
                done += 1;
            }
        }
    }
}

fn compare_all(primary: &Server, replica: &Server) {
    sync_replica(primary, replica);
    let mut pcon = primary.conn();
    let mut rcon = replica.conn();
    let mut present = 0;
    for i in 0..KEYS {
        let key = format!("rk:{i}");
        let p = (
            digest(&mut pcon, &key),
            pexpiretime(&mut pcon, &key),
            exists(&mut pcon, &key),
        );
        let r = (
            digest(&mut rcon, &key),
            pexpiretime(&mut rcon, &key),
            exists(&mut rcon, &key),
        );
        assert_eq!(
            p,
            r,
            "{key} ({}): primary vs replica (digest, PEXPIRETIME, EXISTS)",
            algo_of(i).name()
        );
        if p.2 {
            present += 1;
            assert!(p.1 > 0, "{key}: no expiry on the primary");
        }
    }
    assert!(present > KEYS / 2, "only {present} keys were written");
}

fn assert_only_apply_replicated(replica: &Server) {
    let mut rcon = replica.conn();
    let stats = info(&mut rcon, "commandstats").to_lowercase();
    assert!(
        stats.contains("cmdstat_rl.apply:"),
        "the replica never ran rl.apply:\n{stats}"
    );
    for cmd in ["rl.tokenbucket", "rl.window", "rl.slidinglog"] {
        assert!(
            !stats.contains(&format!("cmdstat_{cmd}:")),
            "the replica ran {cmd}: the command itself was replicated, not its effect\n{stats}"
        );
    }
}

#[test]
fn random_traffic_replicates_exactly() {
    let (primary, replica) = primary_and_replica(&[]);
    let mut con = primary.conn();
    avoid_window_edges(&mut con);
    let mut rng = StdRng::seed_from_u64(0x5eed_1234);
    drive(&mut con, &mut rng, 3000);
    compare_all(&primary, &replica);
    assert_only_apply_replicated(&replica);
    // The replica refuses client writes.
    let mut rcon = replica.conn();
    let e = q_err(&mut rcon, &argv!["RL.TOKENBUCKET", "rk:0", 5, 1, "1h"]);
    assert!(e.starts_with("READONLY"), "{e}");
}

/// A replica that joins later gets the state through the RDB transfer, then
/// follows through RL.APPLY.
#[test]
fn full_sync_then_stream() {
    let primary = Server::start_with(QUIET_PRIMARY);
    let mut con = primary.conn();
    avoid_window_edges(&mut con);
    let mut rng = StdRng::seed_from_u64(77);
    drive(&mut con, &mut rng, 1500);
    let replica = start_replica(&primary);
    compare_all(&primary, &replica);
    drive(&mut con, &mut rng, 1500);
    compare_all(&primary, &replica);
    assert_only_apply_replicated(&replica);
}

/// Diskless full sync (the replica loads from the socket).
#[test]
fn diskless_full_sync() {
    let primary = Server::start_with(&[
        "--repl-ping-replica-period",
        "3600",
        "--repl-diskless-sync",
        "yes",
        "--repl-diskless-sync-delay",
        "0",
    ]);
    let mut con = primary.conn();
    avoid_window_edges(&mut con);
    let mut rng = StdRng::seed_from_u64(99);
    drive(&mut con, &mut rng, 1000);
    let port = primary.port.to_string();
    let replica = Server::start_with(&[
        "--replicaof",
        "127.0.0.1",
        &port,
        "--repl-timeout",
        "3600",
        "--repl-diskless-load",
        "swapdb",
    ]);
    let mut rcon = replica.conn();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while field(&info(&mut rcon, "replication"), "master_link_status").as_deref() != Some("up") {
        assert!(
            std::time::Instant::now() < deadline,
            "link not up\n{}",
            replica.log_tail(30)
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    compare_all(&primary, &replica);
}

/// Keys expire on the primary and the deletion reaches the replica.
#[test]
fn expiry_reaches_the_replica() {
    let (primary, replica) = primary_and_replica(&[]);
    let mut con = primary.conn();
    for algo in Algo::ALL {
        rl(&mut con, &algo.cmd(&format!("short:{algo:?}"), 3, "200ms"));
    }
    sync_replica(&primary, &replica);
    let mut rcon = replica.conn();
    for algo in Algo::ALL {
        let key = format!("short:{algo:?}");
        assert_eq!(
            pexpiretime(&mut con, &key),
            pexpiretime(&mut rcon, &key),
            "{key}"
        );
    }
    std::thread::sleep(std::time::Duration::from_millis(700));
    for algo in Algo::ALL {
        let key = format!("short:{algo:?}");
        assert!(
            !exists(&mut con, &key),
            "{key} should have expired on the primary"
        );
    }
    sync_replica(&primary, &replica);
    assert_eq!(
        int(&q(&mut rcon, &argv!["DBSIZE"])),
        0,
        "expired keys are deleted on the replica"
    );
}

/// An AOF replayed on the replica's side is RL.APPLY too: a replica with
/// its own AOF restarts into the same state.
#[test]
fn replica_with_aof_restarts_into_the_same_state() {
    let primary = Server::start_with(QUIET_PRIMARY);
    let port = primary.port.to_string();
    let mut replica = Server::start_with(&[
        "--replicaof",
        "127.0.0.1",
        &port,
        "--repl-timeout",
        "3600",
        "--appendonly",
        "yes",
        "--aof-use-rdb-preamble",
        "no",
    ]);
    let mut rcon = replica.conn();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while field(&info(&mut rcon, "replication"), "master_link_status").as_deref() != Some("up") {
        assert!(
            std::time::Instant::now() < deadline,
            "link not up\n{}",
            replica.log_tail(30)
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mut con = primary.conn();
    avoid_window_edges(&mut con);
    let mut rng = StdRng::seed_from_u64(5);
    drive(&mut con, &mut rng, 1500);
    compare_all(&primary, &replica);
    wait_for_rewrite(&mut rcon);
    let digests: Vec<String> = (0..KEYS)
        .map(|i| digest(&mut rcon, &format!("rk:{i}")))
        .collect();
    drop(rcon);
    // Restart the replica without its primary's help: detach first.
    let mut rcon = replica.conn();
    q(&mut rcon, &argv!["REPLICAOF", "NO", "ONE"]);
    drop(rcon);
    replica.restart_with(
        Shutdown::NoSave,
        Some(&[
            "--repl-timeout",
            "3600",
            "--appendonly",
            "yes",
            "--aof-use-rdb-preamble",
            "no",
        ]),
    );
    let mut rcon = replica.conn();
    for (i, d) in digests.iter().enumerate() {
        assert_eq!(
            &digest(&mut rcon, &format!("rk:{i}")),
            d,
            "rk:{i} after the replica's AOF replay"
        );
    }
}

/// RL.APPLY is passed on verbatim: a replica of a replica gets the same state.
#[test]
fn chained_replicas_agree() {
    let (primary, replica) = primary_and_replica(&[]);
    let sub = start_replica(&replica);
    let mut con = primary.conn();
    avoid_window_edges(&mut con);
    let mut rng = StdRng::seed_from_u64(2024);
    drive(&mut con, &mut rng, 1000);
    compare_all(&primary, &replica);
    sync_replica(&replica, &sub);
    let mut pcon = primary.conn();
    let mut scon = sub.conn();
    for i in 0..KEYS {
        let key = format!("rk:{i}");
        assert_eq!(
            (digest(&mut pcon, &key), pexpiretime(&mut pcon, &key)),
            (digest(&mut scon, &key), pexpiretime(&mut scon, &key)),
            "{key} on the sub-replica"
        );
    }
    assert_only_apply_replicated(&sub);
}

/// A primary that loads an RDB skips keys whose time has passed, without a
/// DEL for its replicas, which never expire keys themselves: the replica
/// still holds the old sliding log when the primary logs a request on a
/// fresh one. The replica must start from empty too, not merge into it.
#[test]
fn a_log_the_primary_dropped_unseen_starts_fresh_on_the_replica() {
    let (primary, replica) = primary_and_replica(&[]);
    let mut con = primary.conn();
    // Only the reload may drop the key (no expiry cycle, no lookup).
    q(&mut con, &argv!["DEBUG", "SET-ACTIVE-EXPIRE", 0]);
    rl(
        &mut con,
        &argv!["RL.SLIDINGLOG", "log", 10, "100ms", "COST", 7],
    );
    sync_replica(&primary, &replica);
    std::thread::sleep(std::time::Duration::from_millis(300));
    q(&mut con, &argv!["DEBUG", "RELOAD"]);
    let reply = rl(&mut con, &argv!["RL.SLIDINGLOG", "log", 3, "1h"]);
    assert_eq!((reply.allowed, reply.remaining), (true, 2));
    sync_replica(&primary, &replica);
    let mut on_replica = replica.conn();
    assert_eq!(
        digests_and_expiries(&mut on_replica, &["log".to_string()]),
        digests_and_expiries(&mut con, &["log".to_string()]),
    );
}
