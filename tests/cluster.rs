//! Cluster mode: the module loads, and the commands declare their key so a
//! node refuses a key whose slot it does not serve.

mod common;

use common::*;

#[test]
fn key_positions_are_honoured_in_cluster_mode() {
    let server = Server::start_with(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
    ]);
    let mut con = server.conn();
    // Serve the lower half of the slots only.
    q(&mut con, &argv!["CLUSTER", "ADDSLOTSRANGE", 0, 8191]);
    let served = |con: &mut redis::Connection, key: &str| {
        int(&q(con, &argv!["CLUSTER", "KEYSLOT", key])) <= 8191
    };
    let mut mine = None;
    let mut theirs = None;
    for i in 0..1000 {
        let key = format!("ck:{i}");
        if served(&mut con, &key) {
            mine.get_or_insert(key);
        } else {
            theirs.get_or_insert(key);
        }
    }
    let (mine, theirs) = (mine.unwrap(), theirs.unwrap());
    // With part of the slots unassigned the cluster is down; allow it to
    // serve anyway, the check is about key ownership.
    q(
        &mut con,
        &argv!["CONFIG", "SET", "cluster-require-full-coverage", "no"],
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while field(
        &string(&q(&mut con, &argv!["CLUSTER", "INFO"])),
        "cluster_state",
    )
    .as_deref()
        != Some("ok")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "cluster_state never became ok"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    for algo in Algo::ALL {
        let r = rl(&mut con, &algo.cmd(&mine, 5, "1h"));
        assert!(r.allowed, "{}: {r:?}", algo.name());
        q(&mut con, &argv!["DEL", &mine]);
        let e = q_err(&mut con, &algo.cmd(&theirs, 5, "1h"));
        assert!(
            e.starts_with("CLUSTERDOWN") || e.starts_with("MOVED"),
            "{} on a key of an unserved slot: {e}",
            algo.name()
        );
        assert_eq!(
            int(&q(&mut con, &argv!["DBSIZE"])),
            0,
            "{}: written on the wrong node",
            algo.name()
        );
    }
    let e = q_err(&mut con, &argv!["RL.APPLY", &theirs, "x"]);
    assert!(
        e.starts_with("CLUSTERDOWN") || e.starts_with("MOVED"),
        "RL.APPLY: {e}"
    );
    // Stored policies have no key: any node takes them; RL.LIMIT routes by
    // its key like the algorithm's command.
    assert_eq!(
        q(&mut con, &argv!["RL.POLICY.SET", "p", "WINDOW", 5, "1h"]),
        redis::Value::Okay
    );
    assert!(rl(&mut con, &argv!["RL.LIMIT", &mine, "p"]).allowed);
    let e = q_err(&mut con, &argv!["RL.LIMIT", &theirs, "p"]);
    assert!(
        e.starts_with("CLUSTERDOWN") || e.starts_with("MOVED"),
        "RL.LIMIT on a key of an unserved slot: {e}"
    );
    assert_eq!(int(&q(&mut con, &argv!["DBSIZE"])), 1);
}

#[test]
fn module_cannot_be_unloaded_and_survives_the_attempt() {
    let mut server = Server::start();
    let mut con = server.conn();
    rl(&mut con, &Algo::SlidingLog.cmd("k", 5, "1h"));
    let e = q_err(&mut con, &argv!["MODULE", "UNLOAD", "ratelimit"]);
    assert!(e.starts_with("ERR"), "{e}");
    let r = rl(&mut con, &Algo::SlidingLog.cmd("k", 5, "1h"));
    assert!(r.allowed && r.remaining == 3, "{r:?}");
    server.assert_alive();
}

/// MOVE and SWAPDB carry limiters between databases.
#[test]
fn move_and_swapdb() {
    let server = Server::start();
    let mut con = server.conn();
    rl(&mut con, &Algo::TokenBucket.cmd("m", 5, "1h"));
    let state = key_state(&mut con, "m");
    assert_eq!(int(&q(&mut con, &argv!["MOVE", "m", 1])), 1);
    assert!(!exists(&mut con, "m"));
    q(&mut con, &argv!["SWAPDB", 0, 1]);
    assert_eq!(key_state(&mut con, "m"), state);
    let r = rl(&mut con, &Algo::TokenBucket.cmd("m", 5, "1h"));
    assert!(r.allowed && r.remaining == 3, "{r:?}");
}
