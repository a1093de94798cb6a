//! The one-way propagation switch (src/shell/propagation.rs): a standalone
//! primary with no AOF, backlog or replica skips building effects, and
//! every path by which something could later read the stream turns it on
//! for good. Each path ends with the reader holding exactly the primary's
//! keys. The test servers start with `--save '' --appendonly no`, so every
//! other test's primary starts with the switch off too.

mod common;

use common::cluster::{algo_of, assert_same_state, populate, snapshot, LIMIT, PERIOD};
use common::*;
use redis::Connection;

fn propagating(con: &mut Connection) -> bool {
    rl_stat(con, "propagating") == 1
}

fn replicate_from(replica: &Server, primary: &Server) {
    let mut con = replica.conn();
    q(&mut con, &argv!["REPLICAOF", "127.0.0.1", primary.port]);
    wait_for(&mut con, "replication", "master_link_status", "up");
    sync_replica(primary, replica);
}

/// One more call on each of `populate`'s keys.
fn call_again(con: &mut Connection, keys: &[String]) {
    for (i, key) in keys.iter().enumerate() {
        rl(con, &algo_of(i).cmd(key, LIMIT, PERIOD));
    }
}

fn sync_stat(con: &mut Connection, name: &str) -> i64 {
    field(&info(con, "stats"), name)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in INFO stats"))
}

fn changes_since_save(con: &mut Connection) -> i64 {
    field(&info(con, "persistence"), "rdb_changes_since_last_save")
        .and_then(|v| v.parse().ok())
        .expect("rdb_changes_since_last_save")
}

#[test]
fn a_full_sync_carries_what_was_written_while_skipping_disk_and_diskless() {
    for diskless in ["no", "yes"] {
        let primary = Server::start_with(&[
            "--repl-diskless-sync",
            diskless,
            "--repl-diskless-sync-delay",
            "0",
        ]);
        let mut con = primary.conn();
        assert!(!propagating(&mut con), "a lone primary skips");
        let before = populate(&mut con, "before", 24);
        let replica = Server::start();
        replicate_from(&replica, &primary);
        assert!(propagating(&mut con), "a full sync (a fork) turns it on");
        // Keys written before the sync, changed again after it.
        call_again(&mut con, &before);
        let mut keys = populate(&mut con, "after", 24);
        keys.extend(before);
        sync_replica(&primary, &replica);
        let snaps = snapshot(&mut con, &keys);
        let mut rcon = replica.conn();
        assert_same_state(
            &mut rcon,
            &snaps,
            0,
            &format!("replica (diskless {diskless})"),
        );
    }
}

#[test]
fn a_partial_resync_after_the_switch_carries_every_change() {
    let primary = Server::start_with(QUIET_PRIMARY);
    let replica = Server::start();
    let mut con = primary.conn();
    populate(&mut con, "before", 12);
    replicate_from(&replica, &primary);
    let full = sync_stat(&mut con, "sync_full");
    let partial = sync_stat(&mut con, "sync_partial_ok");
    q(&mut con, &argv!["CLIENT", "KILL", "TYPE", "replica"]);
    let keys = populate(&mut con, "while-away", 24);
    let mut rcon = replica.conn();
    wait_for(&mut rcon, "replication", "master_link_status", "up");
    sync_replica(&primary, &replica);
    assert_eq!(
        sync_stat(&mut con, "sync_full"),
        full,
        "no second full sync"
    );
    assert_eq!(sync_stat(&mut con, "sync_partial_ok"), partial + 1);
    let snaps = snapshot(&mut con, &keys);
    assert_same_state(&mut rcon, &snaps, 0, "replica after a partial resync");
}

#[test]
fn a_primary_restarted_from_an_rdb_with_a_replication_id_keeps_propagating() {
    let mut primary = Server::start();
    let replica = Server::start_with(&["--repl-timeout", "3600"]);
    let mut con = primary.conn();
    replicate_from(&replica, &primary);
    let mut keys = populate(&mut con, "before", 12);
    sync_replica(&primary, &replica);
    drop(con);
    // The RDB holds the replication id: the old replica may resync partially
    // from the backlog the restarted primary rebuilds.
    primary.restart(Shutdown::Save);
    let mut con = primary.conn();
    keys.extend(populate(&mut con, "after-restart", 24));
    assert!(propagating(&mut con), "a backlog after loading turns it on");
    let mut rcon = replica.conn();
    wait_for(&mut rcon, "replication", "master_link_status", "up");
    sync_replica(&primary, &replica);
    assert_eq!(
        sync_stat(&mut con, "sync_full"),
        0,
        "the replica resynced partially"
    );
    assert_eq!(sync_stat(&mut con, "sync_partial_ok"), 1);
    let snaps = snapshot(&mut con, &keys);
    assert_same_state(&mut rcon, &snaps, 0, "replica after the primary's restart");
}

#[test]
fn a_primary_restarted_from_an_rdb_without_replicas_skips_again_and_keeps_its_keys() {
    let mut primary = Server::start();
    let mut con = primary.conn();
    let keys = populate(&mut con, "solo", 24);
    let before = snapshot(&mut con, &keys);
    drop(con);
    primary.restart(Shutdown::Save);
    let mut con = primary.conn();
    assert_same_state(&mut con, &before, 0, "the restarted primary");
    // The first change after loading decides: the backlog is gone by then.
    rl(&mut con, &Algo::FixedWindow.cmd("solo:new", 5, "1h"));
    assert!(
        !propagating(&mut con),
        "no backlog, no replica, no AOF after loading: still nothing to feed"
    );
}

#[test]
fn appendonly_switched_on_at_runtime_keeps_every_change_in_the_aof() {
    let mut server = Server::start();
    let mut con = server.conn();
    assert!(!propagating(&mut con));
    let before = populate(&mut con, "before", 24);
    q(&mut con, &argv!["CONFIG", "SET", "appendonly", "yes"]);
    wait_for_rewrite(&mut con);
    assert!(
        propagating(&mut con),
        "the AOF (and its rewrite's fork) turns it on"
    );
    call_again(&mut con, &before);
    let mut keys = populate(&mut con, "after", 24);
    keys.extend(before);
    let snaps = snapshot(&mut con, &keys);
    drop(con);
    server.restart_with(Shutdown::NoSave, Some(&["--appendonly", "yes"]));
    let mut con = server.conn();
    assert_same_state(&mut con, &snaps, 0, "the server reloaded from its AOF");
}

#[test]
fn transactions_scripts_and_wait_while_skipping_then_with_a_replica() {
    let primary = Server::start();
    let mut con = primary.conn();
    assert!(!propagating(&mut con));
    let script = "return {redis.call('RL.WINDOW', KEYS[1], 3, '1h'), \
                  redis.call('RL.GCRA', KEYS[2], 3, 1, '1h')}";
    let round = |con: &mut Connection, tag: &str| -> Vec<String> {
        let keys: Vec<String> = (0..4).map(|i| format!("tx:{tag}:{i}")).collect();
        exec(
            con,
            &[
                Algo::TokenBucket.cmd(&keys[0], 3, "1h"),
                Algo::SlidingLog.cmd(&keys[1], 3, "1h"),
                Algo::TokenBucket.cmd(&keys[0], 3, "1h"),
            ],
        );
        for _ in 0..4 {
            q(con, &argv!["EVAL", script, 2, &keys[2], &keys[3]]);
        }
        keys
    };
    let mut keys = round(&mut con, "skipping");
    assert_eq!(
        int(&q(&mut con, &argv!["WAIT", 1, 50])),
        0,
        "no replica to ack"
    );
    let replica = Server::start();
    replicate_from(&replica, &primary);
    keys.extend(round(&mut con, "replicated"));
    keys.extend(round(&mut con, "skipping"));
    assert_eq!(int(&q(&mut con, &argv!["WAIT", 1, 5000])), 1);
    sync_replica(&primary, &replica);
    let mut rcon = replica.conn();
    assert_eq!(
        digests_and_expiries(&mut rcon, &keys),
        digests_and_expiries(&mut con, &keys)
    );
}

#[test]
fn save_points_count_the_same_changes_either_way() {
    let skipping = Server::start();
    let always = Server::start_with(&["--ratelimit.always-propagate", "yes"]);
    let mut counts = Vec::new();
    for server in [&skipping, &always] {
        let mut con = server.conn();
        let before = changes_since_save(&mut con);
        for algo in Algo::ALL {
            for _ in 0..7 {
                rl(&mut con, &algo.cmd(&format!("save:{algo:?}"), 5, "1h"));
            }
        }
        counts.push((propagating(&mut con), changes_since_save(&mut con) - before));
    }
    assert!(!counts[0].0 && counts[1].0, "{counts:?}");
    assert!(
        counts[0].1 >= 5 * 5,
        "every granted call is a change: {counts:?}"
    );
    assert_eq!(counts[0].1, counts[1].1, "{counts:?}");
}

#[test]
fn every_other_reader_turns_it_on() {
    // A role change (a replica later promoted keeps its backlog).
    let other = Server::start();
    let server = Server::start();
    let mut con = server.conn();
    assert!(!propagating(&mut con));
    q(&mut con, &argv!["REPLICAOF", "127.0.0.1", other.port]);
    q(&mut con, &argv!["REPLICAOF", "NO", "ONE"]);
    assert!(propagating(&mut con), "role change");

    // The operator's switch, at load and at runtime.
    let server = Server::start_with(&["--ratelimit.always-propagate", "yes"]);
    assert!(propagating(&mut server.conn()), "always-propagate at load");
    let server = Server::start();
    let mut con = server.conn();
    q(
        &mut con,
        &argv!["CONFIG", "SET", "ratelimit.always-propagate", "yes"],
    );
    assert!(propagating(&mut con), "always-propagate set at runtime");

    // An AOF from the start; any fork (BGSAVE).
    let server = Server::start_with(&aof_args("yes"));
    assert!(propagating(&mut server.conn()), "AOF at start");
    let server = Server::start();
    let mut con = server.conn();
    q(&mut con, &argv!["BGSAVE"]);
    assert!(propagating(&mut con), "a fork");

    // Cluster mode.
    let server = Server::start_with(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
    ]);
    assert!(propagating(&mut server.conn()), "cluster mode");
}
