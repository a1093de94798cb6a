//! BLOCK: waiting for a permit instead of being denied. Woken at the retry
//! time or by a change, first come first served per key, answered at the
//! timeout, nothing consumed by a client that leaves, propagated only when
//! granted, never blocking inside MULTI/EXEC or a script.

mod common;

use common::*;
use redis::{Connection, Value};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// What one blocking call came to, with the server's clock before it was
/// sent and after its reply arrived (on the same connection).
struct Answered {
    before: i64,
    after: i64,
    reply: Value,
}

fn call_timed(con: &mut Connection, cmd: &[String]) -> Answered {
    let before = server_time_ms(con);
    let reply = raw(con, cmd);
    let after = server_time_ms(con);
    Answered {
        before,
        after,
        reply,
    }
}

/// Starts `cmd` on its own connection in a thread.
fn spawn(server: &Server, cmd: Vec<String>) -> JoinHandle<Answered> {
    let mut con = server.conn();
    thread::spawn(move || call_timed(&mut con, &cmd))
}

/// Starts `cmd` and returns once the server has it waiting.
fn spawn_waiting(
    server: &Server,
    watcher: &mut Connection,
    cmd: Vec<String>,
) -> JoinHandle<Answered> {
    // Counted by calls that waited, not by clients waiting now: an earlier
    // waiter may be served meanwhile (valgrind makes that likely).
    let before = rl_stat(watcher, "blocks");
    let handle = spawn(server, cmd);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while rl_stat(watcher, "blocks") == before {
        assert!(
            std::time::Instant::now() < deadline,
            "the call never waited"
        );
        thread::sleep(Duration::from_millis(2));
    }
    handle
}

fn allowed(v: &Value) -> bool {
    match v {
        Value::Array(items) => int(&items[0]) == 1,
        other => panic!("not a reply: {other:?}"),
    }
}

const TB: fn(&str, &str) -> Vec<String> =
    |key, block| argv!["RL.TOKENBUCKET", key, 1, 1, "300ms", "BLOCK", block];

#[test]
fn a_waiter_is_granted_when_its_permit_is_due() {
    let server = Server::start();
    let mut con = server.conn();
    // GCRA, token bucket, windows and log: each empty, then a waiter.
    let cases: Vec<(Vec<String>, &str)> = vec![
        (argv!["RL.TOKENBUCKET", "tb", 1, 1, "400ms"], "tb"),
        (argv!["RL.GCRA", "g", 1, 1, "400ms"], "g"),
        (argv!["RL.SLIDINGLOG", "log", 1, "400ms"], "log"),
        (argv!["RL.WINDOW", "sw", 1, "400ms", "SLIDING"], "sw"),
    ];
    for (cmd, key) in cases {
        let first = rl(&mut con, &cmd);
        assert!(first.allowed, "{key}: first call");
        let (t0, denied) = timed_rl(&mut con, &cmd);
        assert!(
            !denied.allowed,
            "{key}: second call without BLOCK is denied"
        );
        let due = t0 + denied.retry_after;
        let mut blocking = cmd.clone();
        blocking.extend(argv!["BLOCK", "5s"]);
        let answered = call_timed(&mut con, &blocking);
        let reply = Reply::parse(&answered.reply);
        assert!(reply.allowed, "{key}: the waiter is granted: {reply:?}");
        // Granted no earlier than the advertised retry time (the server's
        // clock), and well before its timeout.
        assert!(
            answered.after >= due,
            "{key}: granted at {} before {due}",
            answered.after
        );
        assert!(
            answered.after < answered.before + 5000,
            "{key}: answered at its timeout"
        );
        // Exactly one permit was taken: the next one is denied again.
        assert!(!rl(&mut con, &cmd).allowed, "{key}: one permit only");
    }
    assert_eq!(rl_stat(&mut con, "blocks"), 4);
    assert_eq!(waiting(&mut con), 0);
}

#[test]
fn a_permit_that_cannot_come_in_time_is_refused_at_once() {
    let server = Server::start();
    let mut con = server.conn();
    let cmd = argv!["RL.GCRA", "g", 1, 1, "60s"];
    assert!(rl(&mut con, &cmd).allowed);
    let mut blocking = cmd.clone();
    blocking.extend(argv!["BLOCK", "1s"]);
    let answered = call_timed(&mut con, &blocking);
    let reply = Reply::parse(&answered.reply);
    assert!(!reply.allowed);
    assert!(reply.retry_after > 1000, "{reply:?}");
    assert_eq!(rl_stat(&mut con, "blocks"), 0, "it never waited");
    // Never: a cost above the capacity is refused at once too.
    let never = argv!["RL.TOKENBUCKET", "tb", 2, 1, "1s", "COST", 3, "BLOCK", 0];
    assert_eq!(rl(&mut con, &never).retry_after, -1);
    assert_eq!(rl_stat(&mut con, "blocks"), 0);
}

#[test]
fn a_lease_waiter_is_answered_at_its_timeout() {
    let server = Server::start();
    let mut con = server.conn();
    let acquire = argv!["RL.LEASE", "l", 1, "60s"];
    assert!(allowed(&q(&mut con, &acquire)));
    let mut blocking = acquire.clone();
    blocking.extend(argv!["BLOCK", "700ms"]);
    let answered = call_timed(&mut con, &blocking);
    let items = array(&answered.reply);
    assert_eq!(int(&items[0]), 0, "denied at the timeout: {items:?}");
    assert_eq!(items[5], Value::Nil, "no lease id");
    let waited = answered.after - answered.before;
    // The server's clock: at least the timeout, and answered soon after it.
    assert!(
        waited >= 700,
        "answered after {waited} ms, before the 700 ms timeout"
    );
    assert!(
        waited < 700 + 500,
        "answered {waited} ms after the call, long past its timeout"
    );
    assert_eq!(rl_stat(&mut con, "block_timeouts"), 1);
    assert_eq!(waiting(&mut con), 0);
}

#[test]
fn a_release_wakes_the_first_lease_waiter() {
    let server = Server::start();
    let mut watcher = server.conn();
    let mut con = server.conn();
    let reply = q(&mut con, &argv!["RL.LEASE", "l", 1, "60s"]);
    let id = string(&array(&reply)[5]);
    let waiter = spawn_waiting(
        &server,
        &mut watcher,
        argv!["RL.LEASE", "l", 1, "60s", "BLOCK", "20s"],
    );
    let released_at = server_time_ms(&mut con);
    assert_eq!(int(&q(&mut con, &argv!["RL.RELEASE", "l", &id])), 1);
    let answered = waiter.join().expect("waiter");
    let items = array(&answered.reply);
    assert_eq!(int(&items[0]), 1, "granted after the release: {items:?}");
    assert_eq!(string(&items[5]).len(), 16, "with a lease id");
    assert!(answered.after >= released_at);
    assert!(
        answered.after < answered.before + 20_000,
        "not at its timeout"
    );
    // It holds the one slot now.
    assert!(!allowed(&q(&mut con, &argv!["RL.LEASE", "l", 1, "60s"])));
}

#[test]
fn waiters_are_served_in_arrival_order() {
    let server = Server::start();
    let mut watcher = server.conn();
    let mut con = server.conn();
    // One token every 150 ms; the bucket is empty.
    let cmd = argv!["RL.TOKENBUCKET", "fifo", 1, 1, "150ms"];
    assert!(rl(&mut con, &cmd).allowed);
    let mut handles = Vec::new();
    for _ in 0..6 {
        let mut blocking = cmd.clone();
        blocking.extend(argv!["BLOCK", "10s"]);
        handles.push(spawn_waiting(&server, &mut watcher, blocking));
    }
    let answers: Vec<Answered> = handles
        .into_iter()
        .map(|h| h.join().expect("waiter"))
        .collect();
    for (i, a) in answers.iter().enumerate() {
        assert!(Reply::parse(&a.reply).allowed, "waiter {i} granted");
    }
    // Each later waiter got its token no earlier than the one before it:
    // the reply of waiter i+1 arrives after waiter i's (the server's clock
    // after each reply, plus one refill apart at least).
    for i in 1..answers.len() {
        assert!(
            answers[i].after >= answers[i - 1].after,
            "waiter {i} was answered before waiter {}",
            i - 1
        );
    }
    let spread = answers[5].after - answers[0].before;
    assert!(spread >= 6 * 150 - 150, "six tokens took {spread} ms");
}

#[test]
fn a_cheaper_later_waiter_does_not_jump_the_queue() {
    let server = Server::start();
    let mut watcher = server.conn();
    let mut con = server.conn();
    // Capacity 3, one token per 200 ms, empty.
    let base = argv!["RL.TOKENBUCKET", "q", 3, 1, "200ms"];
    let mut take_all = base.clone();
    take_all.extend(argv!["COST", 3]);
    let (emptied, reply) = timed_rl(&mut con, &take_all);
    assert!(reply.allowed);
    let mut big = base.clone();
    big.extend(argv!["COST", 3, "BLOCK", "10s"]);
    let first = spawn_waiting(&server, &mut watcher, big);
    let mut small = base.clone();
    small.extend(argv!["COST", 1, "BLOCK", "10s"]);
    let second = spawn_waiting(&server, &mut watcher, small);
    let first = first.join().expect("first");
    let second = second.join().expect("second");
    assert!(Reply::parse(&first.reply).allowed);
    assert!(Reply::parse(&second.reply).allowed);
    // The small request could have had a token after 200 ms, but waits for
    // the big one (600 ms), then for its own token.
    assert!(
        second.after >= first.after,
        "the cost-1 waiter was served before the cost-3 waiter that came first"
    );
    // Three tokens for the first (600 ms), then one for the second.
    assert!(
        second.after >= emptied + 800,
        "the second waiter was served before its token"
    );
}

#[test]
fn a_client_that_leaves_consumes_nothing_and_the_next_is_served() {
    let server = Server::start();
    let mut watcher = server.conn();
    let mut con = server.conn();
    let cmd = argv!["RL.TOKENBUCKET", "d", 1, 1, "300ms"];
    assert!(rl(&mut con, &cmd).allowed);
    // A waiter that disconnects: its thread closes the socket after 50 ms.
    let mut leaver = server.conn();
    leaver
        .set_read_timeout(Some(Duration::from_millis(50)))
        .expect("timeout");
    let before = waiting(&mut watcher);
    let gone = thread::spawn(move || {
        let _ = redis::cmd("RL.TOKENBUCKET")
            .arg(&["d", "1", "1", "300ms", "BLOCK", "10s"])
            .query::<Value>(&mut leaver);
        drop(leaver);
    });
    until_waiting(&mut watcher, before + 1);
    let second = spawn_waiting(&server, &mut watcher, TB("d", "10s"));
    gone.join().expect("leaver");
    let second = second.join().expect("second");
    assert!(
        Reply::parse(&second.reply).allowed,
        "the one behind it is served"
    );
    until_waiting(&mut watcher, 0);
    // Only the second waiter took a token: the bucket refills one per 300 ms
    // and is empty now, not at -1.
    let peek = Reply::parse(&q(&mut con, &argv!["RL.PEEK", "d"]));
    assert_eq!(peek.remaining, 0);
    assert!(peek.reset_after <= 300, "{peek:?}");
}

#[test]
fn client_unblock_answers_without_consuming() {
    let server = Server::start();
    let mut watcher = server.conn();
    let mut con = server.conn();
    let acquire = argv!["RL.LEASE", "u", 1, "60s"];
    assert!(allowed(&q(&mut con, &acquire)));
    for mode in ["TIMEOUT", "ERROR"] {
        let mut blocking = acquire.clone();
        blocking.extend(argv!["BLOCK", 0]);
        let mut waiter_con = server.conn();
        let id = int(&q(&mut waiter_con, &argv!["CLIENT", "ID"]));
        let before = waiting(&mut watcher);
        let handle = thread::spawn(move || raw(&mut waiter_con, &blocking));
        until_waiting(&mut watcher, before + 1);
        assert_eq!(int(&q(&mut con, &argv!["CLIENT", "UNBLOCK", id, mode])), 1);
        let reply = handle.join().expect("waiter");
        match mode {
            "TIMEOUT" => assert_eq!(int(&array(&reply)[0]), 0, "denied: {reply:?}"),
            _ => assert!(
                error_of(&reply).is_some_and(|e| e.starts_with("UNBLOCKED")),
                "{reply:?}"
            ),
        }
        until_waiting(&mut watcher, 0);
    }
    // Still exactly the first lease held.
    let peek = Reply::parse(&q(&mut con, &argv!["RL.PEEK", "u"]));
    assert_eq!(peek.remaining, 0);
    let dry = q(&mut con, &argv!["RL.LEASE", "u", 2, "60s", "DRYRUN"]);
    let items = array(&dry);
    assert_eq!(
        (int(&items[0]), int(&items[2])),
        (1, 0),
        "one slot of two held: {items:?}"
    );
}

#[test]
fn deleting_or_replacing_the_key_answers_its_waiters() {
    let server = Server::start();
    let mut watcher = server.conn();
    let mut con = server.conn();
    let cmd = argv!["RL.GCRA", "k", 1, 1, "30s"];
    assert!(rl(&mut con, &cmd).allowed);
    let mut blocking = cmd.clone();
    blocking.extend(argv!["BLOCK", "60s"]);
    let waiter = spawn_waiting(&server, &mut watcher, blocking.clone());
    q(&mut con, &argv!["DEL", "k"]);
    let answered = waiter.join().expect("waiter");
    assert!(
        Reply::parse(&answered.reply).allowed,
        "a deleted limiter is full again"
    );
    // Replaced by a string: the waiter gets what a new call would.
    let waiter = spawn_waiting(&server, &mut watcher, blocking);
    q(&mut con, &argv!["SET", "k", "text"]);
    let answered = waiter.join().expect("waiter");
    let error = error_of(&answered.reply).unwrap_or_else(|| panic!("{:?}", answered.reply));
    assert!(error.starts_with("WRONGTYPE"), "{error}");
    until_waiting(&mut watcher, 0);
}

#[test]
fn inside_multi_and_scripts_block_answers_at_once() {
    let server = Server::start();
    let mut con = server.conn();
    let cmd = argv!["RL.TOKENBUCKET", "m", 1, 1, "10s"];
    assert!(rl(&mut con, &cmd).allowed);
    let items = exec(&mut con, &[TB("m", "5s")]);
    assert!(
        !Reply::parse(&items[0]).allowed,
        "denied at once inside MULTI/EXEC"
    );
    let script = "return redis.call('RL.TOKENBUCKET', KEYS[1], 1, 1, '10s', 'BLOCK', '5s')";
    let reply = q(&mut con, &argv!["EVAL", script, 1, "m"]);
    assert!(
        !Reply::parse(&reply).allowed,
        "denied at once inside a script"
    );
    assert_eq!(rl_stat(&mut con, "blocks"), 0);
}

#[test]
fn shadow_mode_and_dry_runs() {
    let server = Server::start();
    let mut watcher = server.conn();
    let mut con = server.conn();
    let cmd = argv!["RL.TOKENBUCKET", "s", 1, 1, "300ms"];
    assert!(rl(&mut con, &cmd).allowed);
    // A dry run waits until the request would be allowed, and takes nothing.
    let mut dry = cmd.clone();
    dry.extend(argv!["DRYRUN", "BLOCK", "5s"]);
    let waiter = spawn_waiting(&server, &mut watcher, dry);
    let answered = waiter.join().expect("dry run");
    assert!(Reply::parse(&answered.reply).allowed);
    assert!(rl(&mut con, &cmd).allowed, "the dry run took nothing");
    // Shadow mode answers allowed at once: nothing waits.
    q(
        &mut con,
        &argv!["CONFIG", "SET", "ratelimit.shadow-mode", "yes"],
    );
    let blocks = rl_stat(&mut con, "blocks");
    let mut blocking = cmd.clone();
    blocking.extend(argv!["BLOCK", "5s"]);
    assert!(rl(&mut con, &blocking).allowed);
    assert_eq!(rl_stat(&mut con, "blocks"), blocks);
}

#[test]
fn many_waiters_and_the_server_stays_responsive() {
    let server = Server::start();
    let mut watcher = server.conn();
    let mut con = server.conn();
    // Capacity 50, 50 tokens per 2 s: empty, then 50 waiters of one token.
    let cmd = argv!["RL.TOKENBUCKET", "many", 50, 50, "2s"];
    let mut all = cmd.clone();
    all.extend(argv!["COST", 50]);
    assert!(rl(&mut con, &all).allowed);
    let mut handles = Vec::new();
    for _ in 0..50 {
        let mut blocking = cmd.clone();
        blocking.extend(argv!["BLOCK", "20s"]);
        handles.push(spawn(&server, blocking));
    }
    until_waiting(&mut watcher, 50);
    // Others are served while they wait (the waiters' permits are not due).
    let mut served = 0;
    while waiting(&mut watcher) >= 40 && served < 200 {
        assert_eq!(
            q(&mut con, &argv!["PING"]),
            Value::SimpleString("PONG".into())
        );
        assert!(rl(&mut con, &argv!["RL.WINDOW", "other", 1000, "1m"]).allowed);
        served += 1;
    }
    assert!(
        served > 0,
        "no other command was answered while 50 clients waited"
    );
    let granted = handles
        .into_iter()
        .map(|h| h.join().expect("waiter"))
        .filter(|a| Reply::parse(&a.reply).allowed)
        .count();
    assert_eq!(granted, 50);
    assert_eq!(waiting(&mut watcher), 0);
}

#[test]
fn a_grant_is_propagated_when_it_is_made() {
    let (primary, replica) = primary_and_replica(&[]);
    let mut watcher = primary.conn();
    let mut con = primary.conn();
    let mut rcon = replica.conn();
    let cmd = argv!["RL.TOKENBUCKET", "r", 1, 1, "800ms"];
    assert!(rl(&mut con, &cmd).allowed);
    sync_replica(&primary, &replica);
    let before = applied_calls(&mut rcon);
    let mut blocking = cmd.clone();
    blocking.extend(argv!["BLOCK", "5s"]);
    let waiter = spawn_waiting(&primary, &mut watcher, blocking);
    // While it waits, nothing reaches the replica.
    sync_replica(&primary, &replica);
    assert_eq!(
        applied_calls(&mut rcon),
        before,
        "a waiting request propagated something"
    );
    let answered = waiter.join().expect("waiter");
    assert!(Reply::parse(&answered.reply).allowed);
    sync_replica(&primary, &replica);
    assert_eq!(
        applied_calls(&mut rcon),
        before + 1,
        "the grant propagates one effect"
    );
    let keys = vec!["r".to_string()];
    assert_eq!(
        digests_and_expiries(&mut con, &keys),
        digests_and_expiries(&mut rcon, &keys)
    );
    // A replica refuses the write, BLOCK or not.
    let error = error_of(&raw(&mut rcon, &TB("r", "1s"))).expect("refused");
    assert!(error.starts_with("READONLY"), "{error}");
}

#[test]
fn a_primary_turned_replica_answers_its_waiters() {
    let other = Server::start();
    let server = Server::start();
    let mut watcher = server.conn();
    let mut con = server.conn();
    assert!(allowed(&q(&mut con, &argv!["RL.LEASE", "x", 1, "60s"])));
    let before = waiting(&mut watcher);
    let mut waiter_con = server.conn();
    // The server closes the connection after this reply: no TIME after it.
    let waiter = thread::spawn(move || {
        raw(
            &mut waiter_con,
            &argv!["RL.LEASE", "x", 1, "60s", "BLOCK", 0],
        )
    });
    until_waiting(&mut watcher, before + 1);
    q(&mut con, &argv!["REPLICAOF", "127.0.0.1", other.port]);
    let reply = waiter.join().expect("waiter");
    let error = error_of(&reply).unwrap_or_else(|| panic!("{reply:?}"));
    assert!(error.starts_with("UNBLOCKED"), "{error}");
    until_waiting(&mut watcher, 0);
}

#[test]
fn paused_writes_hold_the_grant_until_the_pause_ends() {
    // A grant propagates; during CLIENT PAUSE WRITE nothing may be
    // propagated (the server asserts it), so the waiter waits out the pause.
    let (primary, replica) = primary_and_replica(&[]);
    let mut watcher = primary.conn();
    let mut con = primary.conn();
    let cmd = argv!["RL.TOKENBUCKET", "p", 1, 1, "200ms"];
    assert!(rl(&mut con, &cmd).allowed);
    let mut blocking = cmd.clone();
    blocking.extend(argv!["BLOCK", "10s"]);
    let waiter = spawn_waiting(&primary, &mut watcher, blocking);
    let paused_at = server_time_ms(&mut con);
    q(&mut con, &argv!["CLIENT", "PAUSE", 800, "WRITE"]);
    let answered = waiter.join().expect("waiter");
    assert!(Reply::parse(&answered.reply).allowed);
    assert!(
        answered.after >= paused_at + 800,
        "granted at {} during the pause that began at {paused_at}",
        answered.after
    );
    primary.conn();
    sync_replica(&primary, &replica);
    let keys = vec!["p".to_string()];
    let mut rcon = replica.conn();
    assert_eq!(
        digests_and_expiries(&mut con, &keys),
        digests_and_expiries(&mut rcon, &keys)
    );
}

#[test]
fn a_waiter_behind_others_times_out_on_time_and_takes_nothing() {
    let server = Server::start();
    let mut watcher = server.conn();
    let mut con = server.conn();
    // One slot, held for a minute: the first waiter waits for it with no
    // timeout, the second gives up after 400 ms.
    let reply = q(&mut con, &argv!["RL.LEASE", "t", 1, "1m"]);
    let id = string(&array(&reply)[5]);
    let first = spawn_waiting(
        &server,
        &mut watcher,
        argv!["RL.LEASE", "t", 1, "1m", "BLOCK", 0],
    );
    let second = spawn_waiting(
        &server,
        &mut watcher,
        argv!["RL.LEASE", "t", 1, "1m", "BLOCK", "400ms"],
    );
    let second = second.join().expect("second");
    let items = array(&second.reply);
    assert_eq!(int(&items[0]), 0, "denied at its timeout: {items:?}");
    assert_eq!(items[5], Value::Nil);
    let waited = second.after - second.before;
    assert!(
        waited >= 400,
        "answered after {waited} ms, before its timeout"
    );
    assert!(waited < 400 + 300, "answered {waited} ms after the call");
    // The first still waits, and gets the slot when it is released.
    assert_eq!(waiting(&mut watcher), 1);
    assert_eq!(int(&q(&mut con, &argv!["RL.RELEASE", "t", &id])), 1);
    let first = first.join().expect("first");
    assert_eq!(int(&array(&first.reply)[0]), 1);
    // A peek with BLOCK never waits.
    let peek = q(
        &mut con,
        &argv!["RL.LEASE", "t", 1, "1m", "COST", 0, "BLOCK", 0],
    );
    assert_eq!(int(&array(&peek)[0]), 1);
}
