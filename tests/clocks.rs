//! Servers whose clocks disagree or jump, faked with libfaketime (Debian
//! package `faketime`): replicas an hour ahead of and half an hour behind
//! their primary, a primary whose clock steps back ten minutes, and one that
//! jumps a day forward.
//!
//! Each faked server reads its offset ("+0", "-10m", "+1d", ...) from a file
//! on every clock read (`FAKETIME_NO_CACHE`), so a test moves a running
//! server's clock by rewriting that file. Debian's valkey-server 8.0.1 hangs at
//! start under libfaketime (its shared jemalloc and libfaketime's start-up
//! call each other), so these tests run the server of `VALKEY_SERVER` when it
//! starts under libfaketime and otherwise the Valkey 9 build of
//! `scripts/valkey9.sh` (cached; built on first use).

mod common;

use common::*;
use redis::Connection;
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::thread::sleep;
use std::time::{Duration, Instant};

const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
const TEN_MINUTES_MS: i64 = 600_000;
const ONE_DAY_MS: i64 = 86_400_000;

/// A clock offset for libfaketime, in a file a test can rewrite while the
/// server runs.
struct FakeClock {
    file: PathBuf,
    // Holds the file; removed on drop.
    _dir: TempDir,
}

impl FakeClock {
    fn new(offset: &str) -> FakeClock {
        let dir = TempDir::new("valkey-rl-faketime");
        let clock = FakeClock {
            file: dir.path.join("offset"),
            _dir: dir,
        };
        clock.set(offset);
        clock
    }

    /// Moves the clock to `offset` from the real time ("+0", "-10m", "+1h",
    /// "+1d"). The file is replaced by a rename: the server rereads it at
    /// every clock read and must never see it half written.
    fn set(&self, offset: &str) {
        let tmp = self.file.with_extension("tmp");
        fs::write(&tmp, format!("{offset}\n")).expect("write faketime offset");
        fs::rename(&tmp, &self.file).expect("rename faketime offset");
    }

    /// The environment of a server on this clock. Not FAKETIME itself (the
    /// file is the source) and not FAKETIME_DONT_FAKE_MONOTONIC.
    fn env(&self) -> Vec<(&str, &str)> {
        vec![
            ("LD_PRELOAD", LIBFAKETIME),
            (
                "FAKETIME_TIMESTAMP_FILE",
                self.file.to_str().expect("utf-8 path"),
            ),
            ("FAKETIME_NO_CACHE", "1"),
            ("TZ", "UTC"),
        ]
    }
}

/// Whether `binary --version` runs to its end under libfaketime (within 3 s;
/// a server that hangs there hangs at once, and --version takes milliseconds).
fn runs_under_faketime(binary: &str) -> bool {
    let clock = FakeClock::new("+0");
    let Ok(mut child) = Command::new(binary)
        .arg("--version")
        .envs(clock.env())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    else {
        return false;
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return status.success(),
            Ok(None) if Instant::now() < deadline => sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
        }
    }
}

/// The server binary these tests run: `VALKEY_SERVER` (or the default) when
/// it works under libfaketime, else the Valkey 9 build.
fn faked_server() -> &'static str {
    static BINARY: OnceLock<String> = OnceLock::new();
    BINARY.get_or_init(|| {
        assert!(
            Path::new(LIBFAKETIME).exists(),
            "{LIBFAKETIME} is missing: install it with `apt-get install -y faketime` (scripts/setup.sh)"
        );
        let own = server_binary();
        if runs_under_faketime(&own) {
            return own;
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/valkey9.sh");
        let out = Command::new("bash")
            .arg(script)
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {script}: {e}"));
        assert!(out.status.success(), "{script} failed: {}", out.status);
        let v9 = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(
            runs_under_faketime(&v9),
            "neither {own} nor {v9} starts under libfaketime"
        );
        eprintln!("clocks: {own} does not start under libfaketime; running {v9}");
        v9
    })
}

/// A server on `clock`.
fn faked(clock: &FakeClock, extra: &[&str]) -> Server {
    Server::start_with_env(faked_server(), &clock.env(), extra)
}

/// The server's clock minus the real one, in ms.
fn skew_ms(con: &mut Connection) -> i64 {
    let real = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64;
    server_time_ms(con) - real
}

/// Waits until a server's clock runs `offset_ms` from the real one (within
/// 5 s), so the test tests what it says. A change of the offset file shows
/// within a millisecond or so, not always at the very next command.
fn assert_skew(con: &mut Connection, offset_ms: i64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let skew = skew_ms(con);
        if (skew - offset_ms).abs() < 5_000 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: clock is {skew} ms off the real one, expected {offset_ms}"
        );
        sleep(Duration::from_millis(1));
    }
}

/// One limiter: its key and what one call with `cost` sends.
#[derive(Clone, Debug)]
struct Spec {
    algo: Algo,
    key: String,
    limit: u64,
    period: &'static str,
}

impl Spec {
    fn new(algo: Algo, prefix: &str, limit: u64, period: &'static str) -> Spec {
        Spec {
            algo,
            key: format!("{prefix}:{algo:?}:{period}"),
            limit,
            period,
        }
    }

    fn call(&self, cost: u64, options: &[&str]) -> Vec<String> {
        let mut cmd = self.algo.cmd(&self.key, self.limit, self.period);
        cmd.extend(argv!["COST", cost]);
        cmd.extend(options.iter().map(|s| s.to_string()));
        cmd
    }
}

// ---------------------------------------------------------------------------
// Replicas on skewed clocks

/// Per algorithm: four keys of 1h periods that live through the test, and
/// three of 300 ms that expire and are created again while traffic goes on.
fn replica_specs() -> (Vec<Spec>, Vec<Spec>) {
    let mut long = Vec::new();
    let mut short = Vec::new();
    for algo in Algo::ALL {
        for i in 0..4u64 {
            long.push(Spec {
                key: format!("long:{algo:?}:{i}"),
                ..Spec::new(algo, "", 3 + 2 * i, "1h")
            });
        }
        for i in 0..3 {
            short.push(Spec {
                key: format!("short:{algo:?}:{i}"),
                ..Spec::new(algo, "", 3, "300ms")
            });
        }
    }
    (long, short)
}

/// Allowed and denied replies per algorithm (in `Algo::ALL` order).
type Tally = [(u64, u64); 5];

/// `calls` random calls on `specs`, in bursts of 20 spaced 30 ms apart, so the
/// traffic lasts about a second and short keys expire while it goes on.
fn drive(
    con: &mut Connection,
    specs: &[Spec],
    next: &mut impl FnMut() -> u64,
    calls: usize,
) -> Tally {
    let mut tally: Tally = [(0, 0); 5];
    for n in 0..calls {
        let spec = &specs[next() as usize % specs.len()];
        let cost = 1 + next() % 2;
        let options: &[&str] = match (spec.algo, next() % 4) {
            (Algo::SlidingLog, 0) => &["COUNTDENIED"],
            (_, 1) => &["DRYRUN"],
            _ => &[],
        };
        let reply = rl(con, &spec.call(cost, options));
        let slot = &mut tally[Algo::ALL.iter().position(|a| *a == spec.algo).unwrap()];
        if reply.allowed {
            slot.0 += 1;
        } else {
            slot.1 += 1;
        }
        if n % 20 == 19 {
            sleep(Duration::from_millis(30));
        }
    }
    tally
}

/// The keys of a server, from KEYS (which hides logically expired keys, so
/// only for the primary, whose clock is the real one).
fn key_set(con: &mut Connection) -> BTreeSet<String> {
    array(&q(con, &argv!["KEYS", "*"]))
        .iter()
        .map(string)
        .collect()
}

fn dbsize(con: &mut Connection) -> i64 {
    int(&q(con, &argv!["DBSIZE"]))
}

/// The replica holds exactly the primary's keys, values and expiry times.
/// DBSIZE and DEBUG DIGEST(-VALUE) count the stored keys whatever the clock
/// says, but a replica an hour ahead takes most keys for expired (EXISTS 0,
/// PEXPIRETIME -2, KEYS leaves them out): so the replica's clock is set to
/// the real time while PEXPIRETIME is read, then back to `offset`.
fn assert_holds_primary_state(
    primary: &Server,
    replica: &Server,
    clock: &FakeClock,
    offset: &str,
    what: &str,
) {
    let mut pcon = primary.conn();
    let mut rcon = replica.conn();
    let keys: Vec<String> = key_set(&mut pcon).into_iter().collect();
    assert_eq!(
        dbsize(&mut pcon),
        keys.len() as i64,
        "primary: KEYS and DBSIZE disagree"
    );
    assert_eq!(
        dbsize(&mut rcon),
        keys.len() as i64,
        "{what}: DBSIZE differs from the primary's"
    );
    let digest_all = |con: &mut Connection| string(&q(con, &argv!["DEBUG", "DIGEST"]));
    assert_eq!(
        digest_all(&mut rcon),
        digest_all(&mut pcon),
        "{what}: DEBUG DIGEST differs from the primary's"
    );
    for key in &keys {
        let d = digest(&mut pcon, key);
        assert_ne!(d, "0".repeat(40), "primary: {key} has no digest");
        assert_eq!(digest(&mut rcon, key), d, "{what}: {key} differs");
    }
    clock.set("+0");
    assert_skew(&mut rcon, 0, what);
    let primary_expiries = digests_and_expiries(&mut pcon, &keys);
    let replica_expiries = digests_and_expiries(&mut rcon, &keys);
    clock.set(offset);
    for ((key, p), r) in keys.iter().zip(&primary_expiries).zip(&replica_expiries) {
        assert!(p.1 > 0, "primary: {key} has no expiry ({})", p.1);
        assert_eq!(r, p, "{what}: {key} (digest, PEXPIRETIME)");
    }
}

/// Two replicas, one an hour ahead of the primary (streamed every change from
/// the start) and one 30 minutes behind (joins halfway, by a full sync),
/// end with the primary's keys and values while short-lived keys expire on
/// the primary. Replicas apply effects and never decide on their own clock,
/// and they never expire keys: the primary's DELs do.
#[test]
fn replicas_on_skewed_clocks_hold_the_primarys_state() {
    let real = FakeClock::new("+0");
    // Replicas join by a full sync at once, not after the default 5 s delay.
    let primary = faked(&real, &["--repl-diskless-sync-delay", "0"]);
    let mut pcon = primary.conn();
    // The 1h fixed windows end at the clock hour: none must end during the
    // test (about 6 s).
    avoid_boundary(&mut pcon, ONE_HOUR_MS, 20_000);

    let ahead_clock = FakeClock::new("+1h");
    let ahead = start_replica_with_env(&primary, faked_server(), &ahead_clock.env());
    assert_skew(&mut ahead.conn(), ONE_HOUR_MS, "replica ahead");

    let (long, short) = replica_specs();
    let all: Vec<Spec> = long.iter().chain(&short).cloned().collect();
    let mut next = xorshift(0x5eed_c10c);
    let first = drive(&mut pcon, &all, &mut next, 700);

    let behind_clock = FakeClock::new("-30m");
    let behind = start_replica_with_env(&primary, faked_server(), &behind_clock.env());
    assert_skew(&mut behind.conn(), -ONE_HOUR_MS / 2, "replica behind");
    let second = drive(&mut pcon, &all, &mut next, 700);

    for (i, algo) in Algo::ALL.iter().enumerate() {
        let (allowed, denied) = (first[i].0 + second[i].0, first[i].1 + second[i].1);
        assert!(
            allowed > 0 && denied > 0,
            "{}: traffic should have both allowed and denied calls ({allowed}, {denied})",
            algo.name()
        );
    }

    // Wait until the primary has expired every short key (a lookup deletes an
    // expired key and propagates the DEL; active expiry may beat it).
    let deadline = Instant::now() + Duration::from_secs(10);
    while short.iter().any(|s| exists(&mut pcon, &s.key)) {
        assert!(Instant::now() < deadline, "short keys did not expire");
        sleep(Duration::from_millis(50));
    }
    let expired: i64 = field(&info(&mut pcon, "stats"), "expired_keys")
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        expired >= short.len() as i64,
        "the short keys should have expired, some more than once: {expired} expired"
    );
    let keys = key_set(&mut pcon);
    for spec in &long {
        assert!(keys.contains(&spec.key), "primary lost {}", spec.key);
    }

    sync_replicas(&primary, &[&ahead, &behind]);
    assert_holds_primary_state(&primary, &ahead, &ahead_clock, "+1h", "replica 1h ahead");
    assert_holds_primary_state(
        &primary,
        &behind,
        &behind_clock,
        "-30m",
        "replica 30m behind",
    );
}

// ---------------------------------------------------------------------------
// A clock stepping back

/// The limiters of the step tests: every algorithm at several periods, one
/// key filled to its limit (`full`, limit 5) and one half used (`half`,
/// limit 10). Windows only at 10m and 1h: a test keeps clear of their edges.
/// Stepping back 10 minutes puts a 10m window exactly one window back.
fn step_specs(periods: &[&'static str]) -> Vec<(Spec, u64)> {
    let mut specs = Vec::new();
    for algo in Algo::ALL {
        for &period in periods {
            if algo.windowed() && !matches!(period, "10m" | "1h") {
                continue;
            }
            specs.push((Spec::new(algo, "full", 5, period), 5));
            specs.push((Spec::new(algo, "half", 10, period), 5));
        }
    }
    specs
}

/// Uses `used` of each limiter, all at one server time (one MULTI), and
/// checks each call was allowed; then a `full` limiter denies one more.
fn fill(con: &mut Connection, specs: &[(Spec, u64)]) {
    let cmds: Vec<Vec<String>> = specs
        .iter()
        .flat_map(|(spec, used)| (0..*used).map(|_| spec.call(1, &[])))
        .collect();
    for (cmd, item) in cmds.iter().zip(exec(con, &cmds)) {
        assert!(Reply::parse(&item).allowed, "{cmd:?} should be allowed");
    }
    for (spec, used) in specs {
        if *used == spec.limit {
            let reply = rl(con, &spec.call(1, &[]));
            assert!(!reply.allowed, "{}: full, yet {reply:?}", spec.key);
        }
    }
}

/// What the step test follows per key: units granted so far, and when the
/// limiter is full again (PEXPIRETIME) before the step.
struct Followed {
    spec: Spec,
    granted: u64,
    expire_at: i64,
}

/// `calls` calls of cost 1 on each key. Notes in `problems` a key that
/// grants more than its limit in all (with periods of a minute or more,
/// nothing would refill within the test without the step) or whose reply
/// claims more room than is left.
fn calls_grant_nothing_more(
    con: &mut Connection,
    followed: &mut [Followed],
    calls: u64,
    when: &str,
    problems: &mut Vec<String>,
) {
    for f in followed.iter_mut() {
        for _ in 0..calls {
            let options: &[&str] = match f.spec.algo {
                // A full sliding log logs its denials too: not in the past either.
                Algo::SlidingLog if f.spec.limit == 5 => &["COUNTDENIED"],
                _ => &[],
            };
            let reply = rl(con, &f.spec.call(1, options));
            if reply.allowed {
                f.granted += 1;
            }
            let (key, limit, granted) = (&f.spec.key, f.spec.limit, f.granted);
            if granted > limit {
                problems.push(format!(
                    "{key} {when}: granted {granted} in all, its limit is {limit} ({reply:?})"
                ));
                break;
            }
            if reply.remaining as u64 > limit - granted {
                problems.push(format!(
                    "{key} {when}: remaining {} after {granted} of {limit} granted",
                    reply.remaining
                ));
                break;
            }
        }
    }
}

/// A primary whose clock steps back 10 minutes grants nothing it would not
/// have granted without the step: full limiters stay full (the token bucket
/// does not refill, a window does not open anew, the sliding log forgets
/// nothing, GCRA's schedule holds), half-used ones grant at most what they
/// had left, and when the clock is set right again nothing has moved back:
/// no limiter is full again, or grants again, earlier than before the step.
/// Every key is checked to the end; the failure lists all that went wrong.
#[test]
fn a_clock_stepping_back_grants_nothing_more() {
    let clock = FakeClock::new("+0");
    let server = faked(&clock, &[]);
    let mut con = server.conn();
    // No window (10m, 1h) may end during the test (about 3 s): then, without
    // the step, nothing at all would be granted to a full limiter.
    avoid_boundary(&mut con, TEN_MINUTES_MS, 15_000);
    let specs = step_specs(&["1m", "10m", "1h"]);
    fill(&mut con, &specs);

    // When each full limiter grants again, as its denial says now.
    let mut next_grant = Vec::new();
    for (spec, used) in &specs {
        if *used == spec.limit {
            let (t, reply) = timed_rl(&mut con, &spec.call(1, &["DRYRUN"]));
            assert!(reply.retry_after > 0, "{}: {reply:?}", spec.key);
            next_grant.push((spec.clone(), t + reply.retry_after));
        }
    }
    let mut followed: Vec<Followed> = specs
        .iter()
        .map(|(spec, used)| Followed {
            spec: spec.clone(),
            granted: *used,
            expire_at: pexpiretime(&mut con, &spec.key),
        })
        .collect();
    let mut problems = Vec::new();

    clock.set("-10m");
    assert_skew(&mut con, -TEN_MINUTES_MS, "after the step back");
    let when = "just after the step back";
    calls_grant_nothing_more(&mut con, &mut followed, 7, when, &mut problems);
    // The clock goes on from 10 minutes back: still nothing more.
    sleep(Duration::from_millis(1100));
    let when = "a second after the step back";
    calls_grant_nothing_more(&mut con, &mut followed, 2, when, &mut problems);

    // The clock is set right again (say NTP corrects it): a limiter that had
    // stored the stepped-back time would now see ten minutes pass, and one
    // that had set an expiry from it would be gone (an absent key is full).
    clock.set("+0");
    assert_skew(&mut con, 0, "after the correction");
    for f in &followed {
        let at = pexpiretime(&mut con, &f.spec.key);
        if at < f.expire_at {
            problems.push(format!(
                "{}: full again at {at} (PEXPIRETIME) after the steps, at {} before them",
                f.spec.key, f.expire_at
            ));
        }
    }
    let when = "after the correction";
    calls_grant_nothing_more(&mut con, &mut followed, 3, when, &mut problems);
    for (spec, before) in &next_grant {
        let (t, reply) = timed_rl(&mut con, &spec.call(1, &["DRYRUN"]));
        // 2 ms: TIME and retry_after_ms are each rounded to the millisecond.
        let again = t.saturating_add(reply.retry_after);
        if reply.allowed || again < before - 2 {
            problems.push(format!(
                "{}: grants again at {again} ({reply:?}), before the steps at {before}",
                spec.key
            ));
        }
    }
    for f in &followed {
        if f.spec.limit == 5 && f.granted != 5 {
            problems.push(format!(
                "{}: full, yet granted {}",
                f.spec.key,
                f.granted - 5
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "a clock stepping back granted more:\n{}",
        problems.join("\n")
    );
}

// ---------------------------------------------------------------------------
// A clock jumping a day forward

/// A day forward, every limiter has expired (the server deletes the keys on
/// its own), and touching one finds it full: allowed with remaining = limit -
/// cost. Keys whose TTL was removed (PERSIST) survive the jump; the
/// algorithms' own arithmetic must find them full too.
#[test]
fn a_day_forward_refills_and_expires_everything() {
    let clock = FakeClock::new("+0");
    let server = faked(&clock, &[]);
    let mut con = server.conn();
    // Filled limiters must be full: no window (10m, 1h) ends while filling.
    avoid_boundary(&mut con, TEN_MINUTES_MS, 5_000);
    let mut specs = step_specs(&["1s", "1m", "1h"]);
    // Copies of the 1h limiters that will have no TTL.
    let persisted: Vec<(Spec, u64)> = specs
        .iter()
        .filter(|(spec, _)| spec.period == "1h")
        .map(|(spec, used)| {
            let key = format!("persisted:{}", spec.key);
            (
                Spec {
                    key,
                    ..spec.clone()
                },
                *used,
            )
        })
        .collect();
    specs.extend(persisted.iter().cloned());
    fill(&mut con, &specs);
    for (spec, _) in &persisted {
        assert_eq!(int(&q(&mut con, &argv!["PERSIST", &spec.key])), 1);
    }
    for (spec, _) in &specs {
        assert!(exists(&mut con, &spec.key), "{} should exist", spec.key);
    }

    clock.set("+1d");
    assert_skew(&mut con, ONE_DAY_MS, "after the jump");
    // The server's active expiry deletes every key that has a TTL, untouched.
    let deadline = Instant::now() + Duration::from_secs(10);
    while dbsize(&mut con) != persisted.len() as i64 {
        assert!(
            Instant::now() < deadline,
            "a day later {} keys remain: {:?}",
            dbsize(&mut con),
            key_set(&mut con)
        );
        sleep(Duration::from_millis(50));
    }
    for (spec, _) in &persisted {
        assert!(exists(&mut con, &spec.key), "{} has no TTL", spec.key);
    }
    for (spec, _) in &specs {
        let reply = rl(&mut con, &spec.call(2, &[]));
        assert!(
            reply.allowed && reply.remaining as u64 == spec.limit - 2,
            "{}: a day later, COST 2 should find it full: {reply:?}",
            spec.key
        );
        assert!(
            pttl(&mut con, &spec.key) > 0,
            "{}: written, it has a TTL",
            spec.key
        );
    }
}

/// Calendar windows end to end on a clock set near the edges: a daily
/// window opened just after a local midnight before a 25-hour or a 23-hour
/// day expires at the next local midnight, 25 or 23 hours on; a monthly one
/// anchored on the 31st, opened on February 29th of a leap year, at the
/// start of March 31st. Its reply, expiry and RL.PEEK agree.
#[test]
fn calendar_windows_end_at_local_boundaries() {
    let ms = |text: &str| text.parse::<jiff::Timestamp>().unwrap().as_millisecond();
    for (spec, opened, boundary) in [
        (
            &["day", "TZ", "Europe/Berlin"][..],
            "2026-10-24T22:00:05Z",
            "2026-10-25T23:00:00Z",
        ),
        (
            &["day", "TZ", "America/New_York"][..],
            "2026-03-08T05:00:05Z",
            "2026-03-09T04:00:00Z",
        ),
        (
            &["day", "TZ", "Europe/Berlin"][..],
            "2026-03-28T23:00:05Z",
            "2026-03-29T22:00:00Z",
        ),
        (
            &["month", "ANCHOR", "31"][..],
            "2028-02-29T12:00:00Z",
            "2028-03-31T00:00:00Z",
        ),
        (
            &["month", "TZ", "Asia/Tokyo", "ANCHOR", "31"][..],
            "2027-02-27T15:00:05Z",
            "2027-03-30T15:00:00Z",
        ),
        (
            &["week", "TZ", "Europe/Berlin", "ANCHOR", "sun"][..],
            "2026-10-24T22:00:05Z",
            "2026-10-31T23:00:00Z",
        ),
    ] {
        let real = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let offset_s = (ms(opened) - real) / 1000;
        let clock = FakeClock::new(&format!("{offset_s:+}s"));
        let server = faked(&clock, &[]);
        let mut con = server.conn();
        let mut argv = argv!["RL.WINDOW", "k", 5];
        argv.extend(spec.iter().map(|s| s.to_string()));
        let before = server_time_ms(&mut con);
        let reply = array(&q(&mut con, &argv)).to_vec();
        let after = server_time_ms(&mut con);
        let boundary = ms(boundary);
        assert!(
            (ms(opened) - 5_000..ms(opened) + 60_000).contains(&before),
            "the faked clock reads {before}, not near {opened}"
        );
        assert_eq!(int(&reply[0]), 1, "{spec:?}");
        let reset = int(&reply[4]);
        assert!(
            (boundary - after..=boundary - before).contains(&reset),
            "{spec:?} at {opened}: reset {reset}, boundary {boundary}, now {before}..{after}"
        );
        assert_eq!(pexpiretime(&mut con, "k"), boundary, "{spec:?}: expiry");
        let peek = array(&q(&mut con, &argv!["RL.PEEK", "k"])).to_vec();
        assert!(
            int(&peek[4]) <= reset && int(&peek[4]) >= reset - 1000,
            "{spec:?}: RL.PEEK"
        );
    }
}
