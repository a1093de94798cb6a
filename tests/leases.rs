//! The lease limiter: RL.LEASE takes slots for a time to live, RL.RELEASE
//! gives them back by id, RL.EXTEND keeps them longer; a lease nobody
//! releases frees its slots when its ttl passes. Reply shape, exact retry
//! times, many clients at once, crashed holders, errors, WRONGTYPE,
//! replication of effects, persistence, the key's own expiry and INFO.

mod common;

use common::*;
use redis::{Connection, Value};
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier, Mutex};
use std::thread::{self, sleep};
use std::time::Duration;

/// RL.LEASE's reply: the five standard fields, then the lease.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Lease {
    allowed: bool,
    limit: i64,
    remaining: i64,
    retry_after: i64,
    reset_after: i64,
    /// 16 lowercase hex digits; None when no lease was granted.
    id: Option<String>,
    /// The ttl granted in ms; 0 when no lease was granted.
    ttl: i64,
}

const LEASE_FIELDS: [&str; 7] = [
    "allowed",
    "limit",
    "remaining",
    "retry_after_ms",
    "reset_after_ms",
    "lease_id",
    "lease_ttl_ms",
];

fn is_lease_id(text: &str) -> bool {
    text.len() == 16 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl Lease {
    /// Parses a RESP2 array of 7 or a RESP3 map with the 7 names in order;
    /// checks what every reply has.
    fn parse(v: &Value) -> Lease {
        let items: Vec<Value> = match v {
            Value::Array(items) => {
                assert_eq!(items.len(), 7, "RL.LEASE replies 7 elements: {v:?}");
                items.clone()
            }
            Value::Map(pairs) => {
                let names: Vec<String> = pairs.iter().map(|(k, _)| string(k)).collect();
                assert_eq!(names, LEASE_FIELDS, "RESP3 names, in order: {v:?}");
                pairs.iter().map(|(_, value)| value.clone()).collect()
            }
            _ => panic!("not an RL.LEASE reply: {v:?}"),
        };
        // The five standard fields, with their invariants.
        let standard = Reply::parse(&Value::Array(items[..5].to_vec()));
        let id = match &items[5] {
            Value::Nil => None,
            Value::BulkString(bytes) => {
                let id = String::from_utf8(bytes.clone()).expect("lease id is text");
                assert!(is_lease_id(&id), "lease id {id:?} is not 16 lowercase hex");
                Some(id)
            }
            other => panic!("lease_id is neither nil nor a bulk string: {other:?} in {v:?}"),
        };
        let ttl = match &items[6] {
            Value::Int(n) => *n,
            other => panic!("lease_ttl_ms is not an integer: {other:?} in {v:?}"),
        };
        match &id {
            Some(_) => assert!(
                standard.allowed && ttl > 0,
                "a lease id comes with a grant: {v:?}"
            ),
            None => assert_eq!(ttl, 0, "no lease, no ttl: {v:?}"),
        }
        Lease {
            allowed: standard.allowed,
            limit: standard.limit,
            remaining: standard.remaining,
            retry_after: standard.retry_after,
            reset_after: standard.reset_after,
            id,
            ttl,
        }
    }
}

fn lease(con: &mut Connection, cmd: &[String]) -> Lease {
    Lease::parse(&q(con, cmd))
}

fn acquire(con: &mut Connection, key: &str, limit: u64, ttl: &str) -> Lease {
    lease(con, &argv!["RL.LEASE", key, limit, ttl])
}

/// Acquires one slot, which must be granted; returns the lease id.
fn granted(con: &mut Connection, key: &str, limit: u64, ttl: &str) -> String {
    let reply = acquire(con, key, limit, ttl);
    assert!(reply.allowed, "{key}: expected a grant: {reply:?}");
    reply.id.expect("a granted lease has an id")
}

/// One RL.LEASE call at a known server time.
fn timed_lease(con: &mut Connection, cmd: &[String]) -> (i64, Lease) {
    let (t, items) = timed(con, &[cmd.to_vec()]);
    if let Some(e) = error_of(&items[0]) {
        panic!("{cmd:?} failed: {e}");
    }
    (t, Lease::parse(&items[0]))
}

fn release(con: &mut Connection, key: &str, id: &str) -> i64 {
    int(&q(con, &argv!["RL.RELEASE", key, id]))
}

fn extend(con: &mut Connection, key: &str, id: &str, ttl: &str) -> i64 {
    int(&q(con, &argv!["RL.EXTEND", key, id, ttl]))
}

/// An id no test granted (64 random bits: a collision is out of reach).
fn unknown_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

// ---------------------------------------------------------------------------
// Reply and decisions

/// A fresh key of limit 3 and ttl 10s, in RESP2 and RESP3: the exact reply
/// of each grant, of the denial at the limit and of a cost above the limit.
#[test]
fn reply_shape_and_exact_values_in_resp2_and_resp3() {
    let server = Server::start();
    for resp3 in [false, true] {
        let mut con = if resp3 {
            server.conn_resp3()
        } else {
            server.conn()
        };
        let key = format!("shape:{resp3}");
        let cmd = argv!["RL.LEASE", &key, 3, "10s"];
        let (t1, items) = timed(&mut con, std::slice::from_ref(&cmd));
        match (&items[0], resp3) {
            (Value::Array(_), false) | (Value::Map(_), true) => {}
            (other, _) => panic!("RESP3 {resp3}: unexpected reply type {other:?}"),
        }
        let first = Lease::parse(&items[0]);
        assert_eq!(
            (
                first.allowed,
                first.limit,
                first.remaining,
                first.retry_after,
                first.reset_after,
                first.ttl
            ),
            (true, 3, 2, 0, 10_000, 10_000),
            "RESP3 {resp3}: first grant {first:?}"
        );
        // A few ms apart: the leases end at distinct times.
        sleep_until_server_ms(&mut con, t1 + 3);
        let (t2, second) = timed_lease(&mut con, &cmd);
        assert_eq!((second.allowed, second.remaining), (true, 1), "{second:?}");
        assert_eq!(second.reset_after, 10_000, "the new lease ends last");
        sleep_until_server_ms(&mut con, t2 + 3);
        let (t3, third) = timed_lease(&mut con, &cmd);
        assert_eq!((third.allowed, third.remaining), (true, 0), "{third:?}");
        let (t4, fourth) = timed_lease(&mut con, &cmd);
        assert_eq!(
            (
                fourth.allowed,
                fourth.remaining,
                fourth.id.as_deref(),
                fourth.ttl
            ),
            (false, 0, None, 0),
            "RESP3 {resp3}: the 4th acquire {fourth:?}"
        );
        assert_eq!(
            fourth.retry_after,
            t1 + 10_000 - t4,
            "retry when the first lease (at {t1}) ends; t2 {t2}"
        );
        assert_eq!(
            fourth.reset_after,
            t3 + 10_000 - t4,
            "reset when the last lease ends"
        );
        // A cost above the limit never fits.
        let never = lease(&mut con, &argv!["RL.LEASE", &key, 3, "10s", "COST", 4]);
        assert_eq!(
            (
                never.allowed,
                never.retry_after,
                never.remaining,
                never.id.as_deref()
            ),
            (false, -1, 0, None),
            "COST 4 of 3: {never:?}"
        );
        let ids: HashSet<String> = [first.id, second.id, third.id]
            .into_iter()
            .map(|id| id.expect("granted"))
            .collect();
        assert_eq!(ids.len(), 3, "three leases, three ids: {ids:?}");
    }
}

/// COST weights slots; the retry time walks the leases from the earliest to
/// end until the cost fits; COST 0 and DRYRUN write and propagate nothing.
#[test]
fn cost_weights_peek_and_dryrun_write_nothing() {
    let (primary, replica) = primary_and_replica(&[]);
    let mut con = primary.conn();
    let mut rcon = replica.conn();
    let key = "w";
    let ask = |cost: u64| argv!["RL.LEASE", key, 5, "1s", "COST", cost];
    // All at one instant t: A (3 slots) ends at t+10s, B (2 slots) at t+5s.
    let (t, items) = timed(
        &mut con,
        &[
            argv!["RL.LEASE", key, 5, "10s", "COST", 3],
            argv!["RL.LEASE", key, 5, "5s", "COST", 2],
            ask(1),
            ask(2),
            ask(3),
            ask(5),
            ask(6),
            ask(0),
        ],
    );
    let replies: Vec<Lease> = items.iter().map(Lease::parse).collect();
    assert_eq!(
        (replies[0].allowed, replies[0].remaining, replies[0].ttl),
        (true, 2, 10_000)
    );
    assert_eq!(
        (replies[1].allowed, replies[1].remaining, replies[1].ttl),
        (true, 0, 5_000)
    );
    // (cost, retry_after_ms): B frees 2 slots at +5s, A 3 more at +10s.
    for (reply, (cost, retry)) in
        replies[2..7]
            .iter()
            .zip([(1, 5_000), (2, 5_000), (3, 10_000), (5, 10_000), (6, -1)])
    {
        assert_eq!(
            (
                reply.allowed,
                reply.remaining,
                reply.retry_after,
                reply.id.as_deref()
            ),
            (false, 0, retry, None),
            "COST {cost} at t {t}: {reply:?}"
        );
        assert_eq!(reply.reset_after, 10_000, "COST {cost}: {reply:?}");
    }
    let peek = &replies[7];
    assert_eq!(
        (
            peek.allowed,
            peek.remaining,
            peek.retry_after,
            peek.reset_after
        ),
        (true, 0, 0, 10_000),
        "COST 0 on a full key: {peek:?}"
    );
    assert_eq!(
        (peek.id.as_deref(), peek.ttl),
        (None, 0),
        "a peek takes no lease"
    );
    sync_replica(&primary, &replica);
    let digest_before = digest(&mut con, key);
    let offset = repl_offset(&mut con);
    let applied_before = applied_calls(&mut rcon);

    // Peeks and dry runs, on the full key and on a fresh one.
    let peek = lease(&mut con, &ask(0));
    assert_eq!((peek.allowed, peek.remaining, peek.id), (true, 0, None));
    let dry = lease(&mut con, &argv!["RL.LEASE", key, 5, "1s", "DRYRUN"]);
    assert_eq!(
        (dry.allowed, dry.remaining, dry.id.as_deref()),
        (false, 0, None)
    );
    assert!(dry.retry_after > 0 && dry.retry_after <= 5_000, "{dry:?}");
    // A lowered limit over what is held: all 5 slots must go for 1 to fit
    // under a limit of 1, so the dry run waits for A.
    let lowered = lease(&mut con, &argv!["RL.LEASE", key, 1, "1s", "DRYRUN"]);
    assert!(!lowered.allowed, "{lowered:?}");
    assert!(lowered.retry_after > 5_000, "waits for A too: {lowered:?}");
    let fresh = lease(&mut con, &argv!["RL.LEASE", "fresh", 4, "7s", "COST", 0]);
    assert_eq!(
        (
            fresh.allowed,
            fresh.remaining,
            fresh.reset_after,
            fresh.id.as_deref()
        ),
        (true, 4, 0, None),
        "COST 0 on an absent key: {fresh:?}"
    );
    let fresh = lease(&mut con, &argv!["RL.LEASE", "fresh", 4, "7s", "DRYRUN"]);
    assert_eq!(
        (fresh.allowed, fresh.remaining, fresh.retry_after),
        (true, 3, 0),
        "DRYRUN answers what the call would: {fresh:?}"
    );
    assert_eq!(fresh.reset_after, 7_000, "{fresh:?}");
    let fresh = lease(
        &mut con,
        &argv!["RL.LEASE", "fresh", 4, "7s", "DRYRUN", "COST", 4],
    );
    assert_eq!((fresh.allowed, fresh.remaining), (true, 0), "{fresh:?}");
    assert!(!exists(&mut con, "fresh"), "a DRYRUN created the key");
    // A dry run with room on an existing key: whatever it answers, nothing
    // is held afterwards that was not held before.
    let room = lease(
        &mut con,
        &argv!["RL.LEASE", key, 6, "1s", "DRYRUN", "COST", 1],
    );
    assert_eq!((room.allowed, room.remaining), (true, 0), "{room:?}");
    if let Some(id) = &room.id {
        assert_eq!(release(&mut con, key, id), 0, "a DRYRUN left a lease {id}");
    }
    assert_eq!(
        digest(&mut con, key),
        digest_before,
        "a peek or dry run wrote"
    );
    assert_eq!(
        repl_offset(&mut con),
        offset,
        "a peek or dry run propagated"
    );
    sync_replica(&primary, &replica);
    assert_eq!(applied_calls(&mut rcon), applied_before);
}

/// RL.LEASE ... DRYRUN decides only: its reply must carry no lease id (no
/// lease is granted, so there is nothing a client could release or extend).
#[test]
fn dryrun_replies_no_lease_id() {
    let server = Server::start();
    let mut con = server.conn();
    let dry = lease(&mut con, &argv!["RL.LEASE", "d", 3, "10s", "DRYRUN"]);
    assert!(dry.allowed, "{dry:?}");
    assert_eq!((dry.id, dry.ttl), (None, 0), "DRYRUN grants no lease");
    assert!(!exists(&mut con, "d"));
}

// ---------------------------------------------------------------------------
// Many clients

const THREADS: usize = 16;

/// Clients acquire, hold briefly and release in a loop: the holders a client
/// counts (after its grant, until just before its release) never exceed the
/// limit, and every slot comes back.
#[test]
fn concurrent_holders_never_exceed_the_limit() {
    const LIMIT: usize = 5;
    const ROUNDS: usize = 40;
    let server = Server::start();
    let barrier = Arc::new(Barrier::new(THREADS));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let mut con = server.conn();
            let (barrier, in_flight, peak) = (
                Arc::clone(&barrier),
                Arc::clone(&in_flight),
                Arc::clone(&peak),
            );
            thread::spawn(move || {
                barrier.wait();
                let mut grants = 0usize;
                for _ in 0..ROUNDS {
                    let reply = acquire(&mut con, "pool", LIMIT as u64, "60s");
                    let Some(id) = reply.id else {
                        assert_eq!(reply.remaining, 0, "denied with room: {reply:?}");
                        assert!(reply.retry_after > 0, "{reply:?}");
                        continue;
                    };
                    let holding = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(holding, Ordering::SeqCst);
                    sleep(Duration::from_millis(1));
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    assert_eq!(release(&mut con, "pool", &id), 1, "release {id}");
                    grants += 1;
                }
                grants
            })
        })
        .collect();
    let grants: usize = handles
        .into_iter()
        .map(|h| h.join().expect("client thread panicked"))
        .sum();
    let peak = peak.load(Ordering::SeqCst);
    assert!(
        peak <= LIMIT,
        "{peak} holders at once with a limit of {LIMIT}"
    );
    // Long ttls: only releases freed slots, so they were reused.
    assert!(
        grants > LIMIT,
        "only {grants} grants: slots were not reused"
    );
    let mut con = server.conn();
    assert_eq!(rl_stat(&mut con, "releases"), grants as i64);
    let after = lease(
        &mut con,
        &argv!["RL.LEASE", "pool", LIMIT, "60s", "COST", 0],
    );
    assert_eq!(
        after.remaining, LIMIT as i64,
        "every slot came back: {after:?}"
    );
}

/// 2 x limit acquires in parallel with a long ttl: exactly `limit` granted,
/// each with its own id and a distinct `remaining`.
#[test]
fn parallel_acquires_grant_exactly_the_limit() {
    const LIMIT: u64 = 200;
    let server = Server::start();
    let barrier = Arc::new(Barrier::new(THREADS));
    let per_thread = 2 * LIMIT as usize / THREADS;
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let mut con = server.conn();
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || {
                barrier.wait();
                (0..per_thread)
                    .map(|_| acquire(&mut con, "burst", LIMIT, "1h"))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let replies: Vec<Lease> = handles
        .into_iter()
        .flat_map(|h| h.join().expect("client thread panicked"))
        .collect();
    let allowed: Vec<&Lease> = replies.iter().filter(|r| r.allowed).collect();
    assert_eq!(allowed.len() as u64, LIMIT, "of {} acquires", replies.len());
    let ids: HashSet<&str> = allowed.iter().filter_map(|r| r.id.as_deref()).collect();
    assert_eq!(ids.len() as u64, LIMIT, "every grant has its own id");
    let mut remaining: Vec<i64> = allowed.iter().map(|r| r.remaining).collect();
    remaining.sort_unstable();
    assert_eq!(remaining, (0..LIMIT as i64).collect::<Vec<_>>());
    for denied in replies.iter().filter(|r| !r.allowed) {
        assert_eq!((denied.remaining, denied.id.as_deref()), (0, None));
    }
    // And every id names its lease.
    let mut con = server.conn();
    for id in &ids {
        assert_eq!(release(&mut con, "burst", id), 1, "{id}");
    }
}

/// Ids are 64 random bits: thousands of grants, no repeat, and no digit
/// position stuck (as a counter or a clock would leave the high digits).
#[test]
fn lease_ids_are_distinct_and_random() {
    const GRANTS: usize = 5000;
    let server = Server::start();
    let mut con = server.conn();
    let mut pipe = redis::pipe();
    for _ in 0..GRANTS {
        pipe.add_command(to_cmd(&argv!["RL.LEASE", "ids", 100_000, "1h"]));
    }
    let replies: Vec<Value> = pipe.query(&mut con).expect("pipeline");
    let ids: Vec<String> = replies
        .iter()
        .map(|v| Lease::parse(v).id.expect("granted"))
        .collect();
    let distinct: HashSet<&String> = ids.iter().collect();
    assert_eq!(distinct.len(), GRANTS, "repeated lease ids");
    for position in 0..16 {
        let digits: HashSet<u8> = ids.iter().map(|id| id.as_bytes()[position]).collect();
        assert_eq!(
            digits.len(),
            16,
            "digit {position} takes only {digits:?} over {GRANTS} ids"
        );
    }
}

// ---------------------------------------------------------------------------
// Holders that crash, release, extend

/// A holder takes every slot and goes away without releasing: the slots are
/// denied until the leases' ttl, and free at the retry time the denial gave.
#[test]
fn a_crashed_holder_frees_its_slots_at_the_ttl() {
    const TTL: i64 = 300;
    let server = Server::start();
    let mut con = server.conn();
    let mut holder = server.conn();
    let cmd = argv!["RL.LEASE", "crash", 2, format!("{TTL}ms")];
    let (t0, items) = timed(&mut holder, &[cmd.clone(), cmd.clone()]);
    let held: Vec<String> = items
        .iter()
        .map(|v| Lease::parse(v).id.expect("granted"))
        .collect();
    drop(holder);
    let (t1, denied) = timed_lease(&mut con, &cmd);
    assert!(
        t1 < t0 + TTL,
        "timing: the check ran {} ms after the grants",
        t1 - t0
    );
    assert_eq!(
        (
            denied.allowed,
            denied.remaining,
            denied.retry_after,
            denied.reset_after
        ),
        (false, 0, t0 + TTL - t1, t0 + TTL - t1),
        "denied until the crashed leases end: {denied:?}"
    );
    sleep_until_server_ms(&mut con, t1 + denied.retry_after);
    let (t2, after) = timed_lease(&mut con, &cmd);
    assert!(after.allowed, "at +{} ms: {after:?}", t2 - t0);
    assert_eq!(after.remaining, 1, "both crashed leases ended: {after:?}");
    for id in &held {
        assert_eq!(release(&mut con, "crash", id), 0, "an ended lease {id}");
    }
}

#[test]
fn release_frees_at_once_and_only_once() {
    let server = Server::start();
    let mut con = server.conn();
    let first = granted(&mut con, "r", 2, "60s");
    let second = granted(&mut con, "r", 2, "60s");
    assert!(!acquire(&mut con, "r", 2, "60s").allowed, "full");
    assert_eq!(release(&mut con, "r", &first), 1);
    let third = acquire(&mut con, "r", 2, "60s");
    assert_eq!((third.allowed, third.remaining), (true, 0), "{third:?}");
    assert_eq!(release(&mut con, "r", &first), 0, "released twice");
    assert_eq!(release(&mut con, "r", &unknown_id()), 0, "never granted");
    // A released lease is not extended back to life.
    assert_eq!(extend(&mut con, "r", &first, "10s"), 0);
    assert!(!acquire(&mut con, "r", 2, "60s").allowed, "still full");
    // Ids are hexadecimal in either case.
    assert_eq!(release(&mut con, "r", &second.to_uppercase()), 1);
    let third = third.id.expect("granted");
    assert_eq!(release(&mut con, "r", &third), 1);
    let peek = lease(&mut con, &argv!["RL.LEASE", "r", 2, "60s", "COST", 0]);
    assert_eq!(peek.remaining, 2, "all released: {peek:?}");
    // An absent key holds nothing, and a release does not create it.
    assert_eq!(release(&mut con, "none", &first), 0);
    assert_eq!(extend(&mut con, "none", &first, "1s"), 0);
    assert!(!exists(&mut con, "none"));
}

/// A lease of 300ms extended to 2s at 150ms is still held at 500ms.
#[test]
fn extend_keeps_a_lease_past_its_ttl() {
    let server = Server::start();
    let mut con = server.conn();
    let cmd = argv!["RL.LEASE", "e", 1, "300ms"];
    let (t0, first) = timed_lease(&mut con, &cmd);
    let id = first.id.expect("granted");
    sleep_until_server_ms(&mut con, t0 + 150);
    let (t1, items) = timed(
        &mut con,
        &[
            argv!["RL.EXTEND", "e", &id, "2s"],
            argv!["PEXPIRETIME", "e"],
        ],
    );
    assert!(t1 < t0 + 300, "timing: extended at +{} ms", t1 - t0);
    assert_eq!(int(&items[0]), 1, "extended while held");
    assert_eq!(
        int(&items[1]),
        t1 + 2000,
        "the key lives as long as the lease"
    );
    sleep_until_server_ms(&mut con, t0 + 500);
    let (t2, denied) = timed_lease(&mut con, &cmd);
    assert!(!denied.allowed, "at +{} ms: {denied:?}", t2 - t0);
    assert_eq!(denied.retry_after, t1 + 2000 - t2, "{denied:?}");
    assert_eq!(release(&mut con, "e", &id), 1, "still held at +500 ms");
    assert!(acquire(&mut con, "e", 1, "300ms").allowed);
}

/// An extension may shorten a lease; an expired lease is not revived.
#[test]
fn extend_shortens_and_never_revives() {
    let server = Server::start();
    let mut con = server.conn();
    let long = granted(&mut con, "s", 1, "60s");
    let (t, items) = timed(
        &mut con,
        &[
            argv!["RL.EXTEND", "s", &long, "100ms"],
            argv!["PEXPIRETIME", "s"],
        ],
    );
    assert_eq!((int(&items[0]), int(&items[1])), (1, t + 100), "shortened");
    sleep_until_server_ms(&mut con, t + 100);
    assert!(
        acquire(&mut con, "s", 1, "1s").allowed,
        "the slot is free at +100 ms"
    );

    // Limit 2: A ends soon, B holds the key.
    let (t_a, a) = timed_lease(&mut con, &argv!["RL.LEASE", "x", 2, "100ms"]);
    let a = a.id.expect("granted");
    granted(&mut con, "x", 2, "60s");
    sleep_until_server_ms(&mut con, t_a + 100);
    assert!(exists(&mut con, "x"), "B keeps the key");
    assert_eq!(extend(&mut con, "x", &a, "60s"), 0, "A had ended");
    assert_eq!(release(&mut con, "x", &a), 0, "A had ended");
    let c = acquire(&mut con, "x", 2, "60s");
    assert_eq!(
        (c.allowed, c.remaining),
        (true, 0),
        "A's slot is free: {c:?}"
    );
    assert!(
        !acquire(&mut con, "x", 2, "60s").allowed,
        "B and C hold both"
    );
}

/// Releases and extensions of one lease race from many clients: exactly one
/// release finds it, and once a client's extension found it gone, none of
/// its later ones finds it again.
#[test]
fn release_and_extend_race_on_one_lease() {
    const RELEASERS: usize = 4;
    const EXTENDERS: usize = 4;
    const ROUNDS: usize = 25;
    const EXTENDS_EACH: usize = 8;
    let server = Server::start();
    let mut con = server.conn();
    let clients = RELEASERS + EXTENDERS;
    let start = Arc::new(Barrier::new(clients + 1));
    let end = Arc::new(Barrier::new(clients + 1));
    let current = Arc::new(Mutex::new(String::new()));
    let (tx, rx) = mpsc::channel::<(bool, Vec<i64>)>();
    let handles: Vec<_> = (0..clients)
        .map(|i| {
            let mut con = server.conn();
            let (start, end, current, tx) = (
                Arc::clone(&start),
                Arc::clone(&end),
                Arc::clone(&current),
                tx.clone(),
            );
            thread::spawn(move || {
                let releaser = i < RELEASERS;
                for _ in 0..ROUNDS {
                    start.wait();
                    let id = current.lock().expect("lock").clone();
                    let results = if releaser {
                        vec![release(&mut con, "race", &id)]
                    } else {
                        (0..EXTENDS_EACH)
                            .map(|_| extend(&mut con, "race", &id, "60s"))
                            .collect()
                    };
                    tx.send((releaser, results)).expect("send");
                    end.wait();
                }
            })
        })
        .collect();
    let mut extended = 0;
    for round in 0..ROUNDS {
        let id = granted(&mut con, "race", 1, "60s");
        *current.lock().expect("lock") = id.clone();
        start.wait();
        end.wait();
        let results: Vec<(bool, Vec<i64>)> = rx.try_iter().collect();
        assert_eq!(results.len(), clients, "round {round}");
        let released: i64 = results.iter().filter(|r| r.0).map(|r| r.1[0]).sum();
        assert_eq!(released, 1, "round {round}: releases that found {id}");
        for (_, seq) in results.iter().filter(|r| !r.0) {
            assert!(seq.iter().all(|n| *n == 0 || *n == 1), "{seq:?}");
            let first_miss = seq.iter().position(|n| *n == 0).unwrap_or(seq.len());
            assert!(
                seq[first_miss..].iter().all(|n| *n == 0),
                "round {round}: an extension found {id} after one found it gone: {seq:?}"
            );
            extended += seq.iter().sum::<i64>();
        }
        assert_eq!(extend(&mut con, "race", &id, "60s"), 0, "round {round}");
        let peek = lease(&mut con, &argv!["RL.LEASE", "race", 1, "60s", "COST", 0]);
        assert_eq!(peek.remaining, 1, "round {round}: the slot is free");
    }
    for h in handles {
        h.join().expect("client thread panicked");
    }
    assert_eq!(rl_stat(&mut con, "extends"), extended);
    assert_eq!(rl_stat(&mut con, "releases"), ROUNDS as i64);
}

// ---------------------------------------------------------------------------
// Errors and other keys

/// Every bad argument: an error naming it, and the key (absent or holding a
/// lease) exactly as it was.
#[test]
fn bad_arguments_are_refused_and_write_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    let held = granted(&mut con, "held", 3, "1h");
    const LIMIT: &str = "ERR limit must be an integer from 1 to 100000";
    const TTL: &str = "ERR ttl must be a duration";
    const ONLY: &str = "ERR RL.LEASE takes only COST, DRYRUN and BLOCK";
    const ID: &str = "ERR lease_id must be 16 hexadecimal digits, as RL.LEASE returned it";
    const ARITY: &str = "ERR wrong number of arguments";
    let lease_cases: Vec<(Vec<String>, &str)> = vec![
        (argv![0, "10s"], LIMIT),
        (argv![100_001, "10s"], LIMIT),
        (argv![-1, "10s"], LIMIT),
        (argv!["abc", "10s"], LIMIT),
        (argv![3, 0], TTL),
        (argv![3, "0ms"], TTL),
        (argv![3, "3651d"], TTL),
        (argv![3, "10x"], TTL),
        (argv![3, "-1s"], TTL),
        (argv![3, "10s", "COST", 100_001], "ERR COST must be"),
        (argv![3, "10s", "COST", -1], "ERR COST must be"),
        (argv![3, "10s", "COST"], "COST"),
        (argv![3, "10s", "COST", 1, "COST", 1], "COST"),
        (argv![3, "10s", "DRYRUN", "DRYRUN"], "DRYRUN"),
        (argv![3, "10s", "PARTIAL"], ONLY),
        (argv![3, "10s", "partial"], ONLY),
        (argv![3, "10s", "LOCKOUT", "1s"], ONLY),
        (argv![3, "10s", "BRIEF"], ONLY),
        (argv![3, "10s", "BLOCK", -1], "BLOCK"),
        (argv![3, "10s", "FOO"], "FOO"),
    ];
    let bad_ids = [
        "",
        "0123",
        "0123456789abcde",
        "0123456789abcdef0",
        "0123456789abcdeg",
        "+123456789abcdef",
        " 123456789abcdef",
        "0x23456789abcdef",
        "0123456789abcd-f",
    ];
    for key in ["absent", "held"] {
        let before = key_state(&mut con, key);
        let mut cases: Vec<(Vec<String>, &str)> = lease_cases
            .iter()
            .map(|(args, needle)| {
                let mut cmd = argv!["RL.LEASE", key];
                cmd.extend(args.iter().cloned());
                (cmd, *needle)
            })
            .collect();
        for bad in bad_ids {
            cases.push((argv!["RL.RELEASE", key, bad], ID));
            cases.push((argv!["RL.EXTEND", key, bad, "10s"], ID));
        }
        for ttl in ["0", "3651d", "x", ""] {
            cases.push((argv!["RL.EXTEND", key, &held, ttl], TTL));
        }
        for cmd in [
            argv!["RL.LEASE"],
            argv!["RL.LEASE", key],
            argv!["RL.LEASE", key, 3],
            argv!["RL.RELEASE", key],
            argv!["RL.RELEASE", key, &held, "x"],
            argv!["RL.EXTEND", key, &held],
            argv!["RL.EXTEND", key, &held, "1s", "x"],
        ] {
            cases.push((cmd, ARITY));
        }
        for (cmd, needle) in &cases {
            let e = q_err(&mut con, cmd);
            assert!(
                e.starts_with("ERR") && e.contains(needle),
                "{cmd:?}: expected an error with {needle:?}, got {e:?}"
            );
            assert_eq!(key_state(&mut con, key), before, "{cmd:?} changed {key}");
        }
    }
    // The lease the bad calls named is still held, with its slot.
    assert_eq!(release(&mut con, "held", &held), 1);
}

/// Other limiters refuse a lease key and RL.LEASE refuses theirs; RL.REFUND
/// is not how a lease gives slots back; a string key is WRONGTYPE to all.
#[test]
fn wrongtype_both_ways_and_refund_refused() {
    let server = Server::start();
    let mut con = server.conn();
    let id = granted(&mut con, "lk", 5, "1h");
    assert_eq!(string(&q(&mut con, &argv!["TYPE", "lk"])), "ratelimit");
    let before = key_state(&mut con, "lk");
    let mut calls: Vec<Vec<String>> = Algo::ALL.iter().map(|a| a.cmd("lk", 5, "1h")).collect();
    calls.push(argv!["RL.THROTTLE", "lk", 5, 1, 60]);
    calls.push(argv!["CL.THROTTLE", "lk", 5, 1, 60]);
    for cmd in &calls {
        let e = q_err(&mut con, cmd);
        assert!(
            e.starts_with("WRONGTYPE key holds a lease limiter (RL.LEASE), not "),
            "{cmd:?}: {e}"
        );
    }
    let e = q_err(&mut con, &argv!["RL.REFUND", "lk", 1]);
    assert!(
        e.starts_with("ERR a lease limiter gets its slots back by RL.RELEASE"),
        "{e}"
    );
    assert_eq!(key_state(&mut con, "lk"), before, "a refused call wrote");
    assert_eq!(release(&mut con, "lk", &id), 1);

    for algo in Algo::ALL {
        let key = format!("other:{algo:?}");
        rl(&mut con, &algo.cmd(&key, 5, "1h"));
        let before = key_state(&mut con, &key);
        for cmd in [
            argv!["RL.LEASE", &key, 5, "1h"],
            argv!["RL.LEASE", &key, 5, "1h", "DRYRUN"],
            argv!["RL.RELEASE", &key, &id],
            argv!["RL.EXTEND", &key, &id, "1h"],
        ] {
            let e = q_err(&mut con, &cmd);
            assert!(
                e.starts_with("WRONGTYPE key holds ")
                    && e.ends_with(", not a lease limiter (RL.LEASE)"),
                "{} {cmd:?}: {e}",
                algo.name()
            );
        }
        assert_eq!(key_state(&mut con, &key), before, "{key}");
    }
    q(&mut con, &argv!["SET", "str", "x"]);
    for cmd in [
        argv!["RL.LEASE", "str", 5, "1h"],
        argv!["RL.RELEASE", "str", &id],
        argv!["RL.EXTEND", "str", &id, "1h"],
    ] {
        let e = q_err(&mut con, &cmd);
        assert!(e.starts_with("WRONGTYPE"), "{cmd:?}: {e}");
    }
    assert_eq!(string(&q(&mut con, &argv!["GET", "str"])), "x");
}

/// RL.PEEK on a lease key: the five fields of a peek under the stored limit.
#[test]
fn peek_reports_a_lease_key() {
    let server = Server::start();
    let mut con = server.conn();
    let (t, items) = timed(
        &mut con,
        &[
            argv!["RL.LEASE", "pk", 5, "10s", "COST", 2],
            argv!["RL.LEASE", "pk", 5, "20s"],
            argv!["RL.PEEK", "pk"],
        ],
    );
    let peek = Reply::parse(&items[2]);
    assert_eq!(
        peek,
        Reply {
            allowed: true,
            limit: 5,
            remaining: 2,
            retry_after: 0,
            reset_after: 20_000,
        },
        "at {t}"
    );
    let before = digest(&mut con, "pk");
    let again = Reply::parse(&q(&mut con, &argv!["RL.PEEK", "pk"]));
    assert_eq!((again.limit, again.remaining), (5, 2));
    assert_eq!(digest(&mut con, "pk"), before, "RL.PEEK wrote");
    // Full: remaining 0.
    lease(&mut con, &argv!["RL.LEASE", "pk", 5, "10s", "COST", 2]);
    let full = Reply::parse(&q(&mut con, &argv!["RL.PEEK", "pk"]));
    assert_eq!((full.allowed, full.remaining), (true, 0), "{full:?}");
}

// ---------------------------------------------------------------------------
// Replication

/// Grants, releases, extensions, denials, peeks and dry runs on several keys:
/// the replica ends equal, having run one RL.APPLY per change and nothing
/// for the calls that changed nothing.
#[test]
fn replica_follows_by_one_effect_per_change() {
    let (primary, replica) = primary_and_replica(&[]);
    let mut con = primary.conn();
    let mut rcon = replica.conn();
    let applied_before = applied_calls(&mut rcon);
    let mut changes = 0;
    let mut keys: Vec<String> = Vec::new();
    let mut held: Vec<(String, String)> = Vec::new();
    for limit in 1..=4u64 {
        let key = format!("rep:{limit}");
        keys.push(key.clone());
        // Nothing changes.
        lease(&mut con, &argv!["RL.LEASE", &key, limit, "1h", "DRYRUN"]);
        lease(&mut con, &argv!["RL.LEASE", &key, limit, "1h", "COST", 0]);
        let ids: Vec<String> = (0..limit)
            .map(|_| granted(&mut con, &key, limit, "1h"))
            .collect();
        changes += limit;
        assert!(!acquire(&mut con, &key, limit, "1h").allowed);
        let never = lease(
            &mut con,
            &argv!["RL.LEASE", &key, limit, "1h", "COST", limit + 1],
        );
        assert_eq!(never.retry_after, -1);
        assert!(!lease(&mut con, &argv!["RL.LEASE", &key, limit, "1h", "DRYRUN"]).allowed);
        assert_eq!(release(&mut con, &key, &ids[0]), 1);
        assert_eq!(release(&mut con, &key, &ids[0]), 0);
        assert_eq!(release(&mut con, &key, &unknown_id()), 0);
        assert_eq!(extend(&mut con, &key, &ids[0], "2h"), 0);
        changes += 1;
        if limit >= 2 {
            assert_eq!(extend(&mut con, &key, &ids[1], "2h"), 1);
            changes += 1;
        }
        held.extend(ids[1..].iter().map(|id| (key.clone(), id.clone())));
        // The released slot goes to someone else.
        let id = granted(&mut con, &key, limit, &format!("{}m", 30 + limit));
        held.push((key.clone(), id));
        changes += 1;
    }
    // A lease that ended is dropped by the next grant, on both sides alike.
    let (t, _) = timed_lease(&mut con, &argv!["RL.LEASE", "rep:drain", 2, "50ms"]);
    held.push(("rep:drain".into(), granted(&mut con, "rep:drain", 2, "1h")));
    sleep_until_server_ms(&mut con, t + 60);
    let third = acquire(&mut con, "rep:drain", 2, "1h");
    assert_eq!((third.allowed, third.remaining), (true, 0), "{third:?}");
    held.push(("rep:drain".into(), third.id.expect("granted")));
    changes += 3;
    keys.push("rep:drain".into());
    // In a transaction: a grant, a denial and a release.
    let items = exec(
        &mut con,
        &[
            argv!["RL.LEASE", "rep:multi", 1, "1h"],
            argv!["RL.LEASE", "rep:multi", 1, "1h"],
        ],
    );
    let id = Lease::parse(&items[0]).id.expect("granted");
    assert!(!Lease::parse(&items[1]).allowed);
    assert_eq!(release(&mut con, "rep:multi", &id), 1);
    held.push(("rep:multi".into(), granted(&mut con, "rep:multi", 1, "1h")));
    changes += 3;
    keys.push("rep:multi".into());
    // On an absent key, nothing.
    assert_eq!(release(&mut con, "rep:none", &id), 0);
    assert_eq!(extend(&mut con, "rep:none", &id, "1s"), 0);

    sync_replica(&primary, &replica);
    let on_primary = digests_and_expiries(&mut con, &keys);
    assert_eq!(digests_and_expiries(&mut rcon, &keys), on_primary);
    for (key, (digest, expire_at)) in keys.iter().zip(&on_primary) {
        assert_ne!(digest, &"0".repeat(40), "{key} missing");
        assert!(*expire_at > 0, "{key} has no expiry");
    }
    assert!(!exists(&mut rcon, "rep:none"));
    assert_eq!(
        applied_calls(&mut rcon) - applied_before,
        changes as i64,
        "one RL.APPLY per grant, release and extension that changed something"
    );
    let stats = info(&mut rcon, "commandstats").to_lowercase();
    for cmd in ["rl.lease", "rl.release", "rl.extend"] {
        assert!(
            !stats.contains(&format!("cmdstat_{cmd}:")),
            "the replica ran {cmd} itself:\n{stats}"
        );
    }
    for key in &keys {
        let p = Reply::parse(&q(&mut con, &argv!["RL.PEEK", key]));
        let r = Reply::parse(&q(&mut rcon, &argv!["RL.PEEK", key]));
        assert_eq!((p.limit, p.remaining), (r.limit, r.remaining), "{key}");
    }
    for cmd in [
        argv!["RL.LEASE", "rep:1", 1, "1h"],
        argv!["RL.RELEASE", "rep:1", &held[0].1],
        argv!["RL.EXTEND", "rep:1", &held[0].1, "1h"],
    ] {
        let e = q_err(&mut rcon, &cmd);
        assert!(e.starts_with("READONLY"), "{cmd:?} on the replica: {e}");
    }
    // Promoted, the replica holds the very leases the primary granted.
    q(&mut rcon, &argv!["REPLICAOF", "NO", "ONE"]);
    for (key, id) in &held {
        assert_eq!(release(&mut rcon, key, id), 1, "{key} {id} on the replica");
    }
}

// ---------------------------------------------------------------------------
// Persistence

/// Leases on a few keys, live for hours (some tied on expiry, one extended,
/// one released): the keys and the ids still held.
fn populate(con: &mut Connection) -> Vec<(String, Vec<String>)> {
    let one = vec![granted(con, "p:one", 1, "1h")];
    let weighted: Vec<String> = [(3, "1h"), (2, "2h"), (5, "90m")]
        .iter()
        .map(|(cost, ttl)| {
            let reply = lease(con, &argv!["RL.LEASE", "p:weighted", 10, ttl, "COST", cost]);
            reply.id.expect("granted")
        })
        .collect();
    // Two at a time in one transaction: equal expiries, ordered by id.
    let mut many: Vec<String> = Vec::new();
    for i in 0..100 {
        let ttl = format!("{}ms", 3_600_000 + 7 * i);
        let cmd = argv!["RL.LEASE", "p:many", 1000, &ttl];
        for item in exec(con, &[cmd.clone(), cmd]) {
            many.push(Lease::parse(&item).id.expect("granted"));
        }
    }
    assert_eq!(extend(con, "p:many", &many[3], "3h"), 1);
    assert_eq!(release(con, "p:many", &many[10]), 1);
    many.remove(10);
    vec![
        ("p:one".into(), one),
        ("p:weighted".into(), weighted),
        ("p:many".into(), many),
    ]
}

fn names(keys: &[(String, Vec<String>)]) -> Vec<String> {
    keys.iter().map(|(k, _)| k.clone()).collect()
}

/// Every lease is still held by its id: released now, once.
fn release_all(con: &mut Connection, keys: &[(String, Vec<String>)], what: &str) {
    for (key, ids) in keys {
        for id in ids {
            assert_eq!(release(con, key, id), 1, "{what}: {key} lost {id}");
        }
        assert_eq!(
            lease(con, &argv!["RL.LEASE", key, 1000, "1h", "COST", 0]).remaining,
            1000,
            "{what}: {key} holds a lease no id names"
        );
    }
}

#[test]
fn debug_reload_and_dump_restore_keep_leases() {
    let server = Server::start();
    let mut con = server.conn();
    let keys = populate(&mut con);
    let before = digests_and_expiries(&mut con, &names(&keys));
    q(&mut con, &argv!["DEBUG", "RELOAD"]);
    assert_eq!(
        digests_and_expiries(&mut con, &names(&keys)),
        before,
        "DEBUG RELOAD"
    );
    q(&mut con, &argv!["DEBUG", "RELOAD"]);
    assert_eq!(
        digests_and_expiries(&mut con, &names(&keys)),
        before,
        "second RELOAD"
    );

    // DUMP/RESTORE and COPY: independent copies of the same leases.
    let mut copies: Vec<(String, Vec<String>)> = Vec::new();
    for (key, ids) in &keys {
        let payload = dump(&mut con, key).expect("DUMP");
        let expire_at = pexpiretime(&mut con, key);
        let restored = format!("{key}:restored");
        let mut restore = redis::cmd("RESTORE");
        restore
            .arg(&restored)
            .arg(expire_at)
            .arg(payload.as_slice())
            .arg("ABSTTL");
        assert_eq!(raw_cmd(&mut con, &restore), Value::Okay, "RESTORE {key}");
        let copy = format!("{key}:copy");
        assert_eq!(int(&q(&mut con, &argv!["COPY", key, &copy])), 1);
        for other in [&restored, &copy] {
            assert_eq!(
                (digest(&mut con, other), pexpiretime(&mut con, other)),
                (digest(&mut con, key), expire_at),
                "{other}"
            );
            copies.push((other.clone(), ids.clone()));
        }
    }
    release_all(&mut con, &keys, "DEBUG RELOAD");
    release_all(&mut con, &copies, "RESTORE / COPY");
}

#[test]
fn rdb_restart_keeps_leases() {
    let mut server = Server::start();
    let mut con = server.conn();
    let keys = populate(&mut con);
    let before = digests_and_expiries(&mut con, &names(&keys));
    drop(con);
    server.restart(Shutdown::Save);
    let mut con = server.conn();
    assert_eq!(digests_and_expiries(&mut con, &names(&keys)), before);
    release_all(&mut con, &keys, "RDB restart");
}

/// Leases written before an AOF rewrite (in its base) and after (in the
/// incremental file, as RL.APPLY) are all back after a restart.
fn aof_restart_keeps_leases(preamble: &str) {
    let mut server = Server::start_with(&aof_args(preamble));
    let mut con = server.conn();
    wait_for_rewrite(&mut con);
    let mut keys = populate(&mut con);
    q(&mut con, &argv!["BGREWRITEAOF"]);
    wait_for_rewrite(&mut con);
    // After the rewrite: a release, a grant, an extension, a new key.
    let old = keys[0].1.pop().expect("p:one's lease");
    assert_eq!(release(&mut con, "p:one", &old), 1);
    keys[0].1.push(granted(&mut con, "p:one", 1, "2h"));
    assert_eq!(extend(&mut con, "p:weighted", &keys[1].1[0], "5h"), 1);
    keys.push(("p:late".into(), vec![granted(&mut con, "p:late", 2, "1h")]));
    let before = digests_and_expiries(&mut con, &names(&keys));
    drop(con);
    server.restart(Shutdown::NoSave);
    let mut con = server.conn();
    assert_eq!(
        digests_and_expiries(&mut con, &names(&keys)),
        before,
        "AOF (preamble {preamble})"
    );
    assert_eq!(
        release(&mut con, "p:one", &old),
        0,
        "released before the restart"
    );
    release_all(&mut con, &keys, &format!("AOF (preamble {preamble})"));
}

#[test]
fn aof_restart_with_preamble_keeps_leases() {
    aof_restart_keeps_leases("yes");
}

#[test]
fn aof_restart_without_preamble_keeps_leases() {
    aof_restart_keeps_leases("no");
}

// ---------------------------------------------------------------------------
// The key's own expiry

/// The key expires when its last lease ends: not at the latest grant's
/// expiry, at the latest lease's; an idle key is gone on its own.
#[test]
fn the_key_expires_with_its_last_lease() {
    let server = Server::start();
    let mut con = server.conn();
    let grant_and_expiry = |con: &mut Connection, ttl: &str| {
        let (t, items) = timed(
            con,
            &[
                argv!["RL.LEASE", "idle", 3, ttl],
                argv!["PEXPIRETIME", "idle"],
            ],
        );
        assert!(Lease::parse(&items[0]).allowed, "{items:?}");
        (t, int(&items[1]))
    };
    let (t1, at) = grant_and_expiry(&mut con, "200ms");
    assert_eq!(at, t1 + 200);
    let (t2, at) = grant_and_expiry(&mut con, "400ms");
    assert_eq!(at, t2 + 400);
    let (_, at) = grant_and_expiry(&mut con, "100ms");
    assert_eq!(at, t2 + 400, "a shorter lease leaves the key's expiry");
    sleep_until_server_ms(&mut con, t2 + 401);
    assert!(!exists(&mut con, "idle"), "idle past its last lease");

    // Releasing the last lease ends the key now.
    let id = granted(&mut con, "gone", 2, "1h");
    let (t, items) = timed(
        &mut con,
        &[
            argv!["RL.RELEASE", "gone", &id],
            argv!["PEXPIRETIME", "gone"],
        ],
    );
    assert_eq!((int(&items[0]), int(&items[1])), (1, t));
    sleep_until_server_ms(&mut con, t + 1);
    assert!(!exists(&mut con, "gone"), "no lease left, no key");

    // An extension moves the key's expiry both ways, never before another
    // lease's end.
    let id = granted(&mut con, "moved", 2, "1h");
    let (t_other, other) = timed_lease(&mut con, &argv!["RL.LEASE", "moved", 2, "10s"]);
    assert!(other.allowed, "{other:?}");
    for ttl in ["2h", "20s", "5s"] {
        let (t, items) = timed(
            &mut con,
            &[
                argv!["RL.EXTEND", "moved", &id, ttl],
                argv!["PEXPIRETIME", "moved"],
            ],
        );
        assert_eq!(int(&items[0]), 1, "extend to {ttl}");
        let expected = match ttl {
            "2h" => t + 7_200_000,
            "20s" => t + 20_000,
            // The other lease now ends last.
            _ => t_other + 10_000,
        };
        assert_eq!(int(&items[1]), expected, "extended to {ttl} at {t}");
    }
}

// ---------------------------------------------------------------------------
// INFO

#[test]
fn info_counts_each_action_once() {
    let server = Server::start();
    let mut con = server.conn();
    let text = info(&mut con, "ratelimit");
    assert!(text.contains("# ratelimit_stats"), "{text}");
    let names = [
        "lease_allowed",
        "lease_denied",
        "releases",
        "extends",
        "errors",
        "tokenbucket_allowed",
    ];
    let before: Vec<i64> = names.iter().map(|n| rl_stat(&mut con, n)).collect();
    let ids: Vec<String> = (0..3).map(|_| granted(&mut con, "c", 3, "1h")).collect();
    assert!(!acquire(&mut con, "c", 3, "1h").allowed);
    assert!(!lease(&mut con, &argv!["RL.LEASE", "c", 3, "1h", "COST", 4]).allowed);
    // Peeks and dry runs count as the answer they got.
    assert!(lease(&mut con, &argv!["RL.LEASE", "c", 3, "1h", "COST", 0]).allowed);
    assert!(!lease(&mut con, &argv!["RL.LEASE", "c", 3, "1h", "DRYRUN"]).allowed);
    assert_eq!(release(&mut con, "c", &ids[0]), 1);
    assert_eq!(release(&mut con, "c", &ids[0]), 0);
    assert_eq!(release(&mut con, "c", &unknown_id()), 0);
    assert_eq!(extend(&mut con, "c", &ids[1], "2h"), 1);
    assert_eq!(extend(&mut con, "c", &ids[2], "2h"), 1);
    assert_eq!(extend(&mut con, "c", &ids[0], "2h"), 0);
    q_err(&mut con, &argv!["RL.LEASE", "c", 0, "1h"]);
    q_err(&mut con, &argv!["RL.RELEASE", "c", "nothex"]);
    let after: Vec<i64> = names.iter().map(|n| rl_stat(&mut con, n)).collect();
    let moved: Vec<(&str, i64)> = names
        .iter()
        .zip(before.iter().zip(&after))
        .map(|(n, (b, a))| (*n, a - b))
        .collect();
    assert_eq!(
        moved,
        vec![
            ("lease_allowed", 4),
            ("lease_denied", 3),
            ("releases", 1),
            ("extends", 2),
            ("errors", 2),
            ("tokenbucket_allowed", 0),
        ]
    );
}
