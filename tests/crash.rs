//! Crashes under load: a client pipelines rate-limit calls from a thread, the
//! server is killed with SIGKILL in the middle, restarted on its AOF, and
//! every grant the client was told about is checked against the state that
//! came back.
//!
//! With `appendfsync always` the server writes and fsyncs the AOF before it
//! replies, so no grant a client received may be missing. With `everysec` it
//! may lose what it had not written yet; the test measures how much.

mod common;

use common::*;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, sleep};
use std::time::{Duration, Instant};

/// Big enough that these limiters allow every call of a round.
const BIG: u64 = 1_000_000_000;
/// Small enough that these limiters deny most calls of a round: the kill
/// comes after 2000 replies at least, about 200 calls on each limiter.
const SMALL: u64 = 50;
/// Calls written to the socket at once before their replies are read.
const BATCH: usize = 64;
/// With everysec, how far back grants may be lost: the server puts an AOF
/// write off for up to 2 s while a background fsync runs; plus a margin.
const LOSS_WINDOW: Duration = Duration::from_millis(2500);

/// One limiter of a round: every call costs 1, so `limit - remaining` (read
/// back with RL.PEEK) is the number of grants the state holds. All periods
/// are a day, the token bucket and GCRA refill one unit a day: within a test
/// nothing refills.
struct Limiter {
    key: String,
    limit: u64,
    cmd: Vec<String>,
}

fn limiters(round: usize) -> Vec<Limiter> {
    let mut all = Vec::new();
    for (limit, size) in [(BIG, "big"), (SMALL, "small")] {
        for algo in Algo::ALL {
            // Each round has its own keys.
            let key = format!("crash:{round}:{size}:{algo:?}");
            let cmd = algo.cmd(&key, limit, "1d");
            all.push(Limiter { key, limit, cmd });
        }
    }
    all
}

/// The RESP encoding of one command.
fn encode(argv: &[String], out: &mut Vec<u8>) {
    out.extend(format!("*{}\r\n", argv.len()).into_bytes());
    for arg in argv {
        out.extend(format!("${}\r\n{arg}\r\n", arg.len()).into_bytes());
    }
}

/// Reads one five-integer reply; `None` when the connection is gone.
fn read_reply(reader: &mut BufReader<TcpStream>) -> Option<[i64; 5]> {
    let mut line = String::new();
    let mut next_line = |line: &mut String| -> Option<()> {
        line.clear();
        match reader.read_line(line) {
            Ok(n) if n > 0 && line.ends_with("\r\n") => Some(()),
            _ => None,
        }
    };
    next_line(&mut line)?;
    assert_eq!(line, "*5\r\n", "unexpected reply");
    let mut fields = [0i64; 5];
    for field in fields.iter_mut() {
        next_line(&mut line)?;
        let number = line.strip_prefix(':').map(|n| n.trim_end().parse());
        *field = match number {
            Some(Ok(n)) => n,
            _ => panic!("unexpected reply element {line:?}"),
        };
    }
    Some(fields)
}

/// What the client saw, per limiter (index into the round's limiters).
#[derive(Default)]
struct Seen {
    /// Calls written to the socket (counted before the write: some may not
    /// have reached the server).
    sent: Vec<u64>,
    /// When each allowed reply arrived, in order.
    granted: Vec<Vec<Instant>>,
    denied: Vec<u64>,
}

/// Pipelines random calls on `limiters` until the connection dies.
/// `replies` counts the replies read so far, for the test to pace the kill.
fn load(port: u16, cmds: Vec<Vec<String>>, seed: u64, replies: Arc<AtomicU64>) -> Seen {
    let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    let mut next = xorshift(seed);
    let mut seen = Seen {
        sent: vec![0; cmds.len()],
        granted: vec![Vec::new(); cmds.len()],
        denied: vec![0; cmds.len()],
    };
    loop {
        let picks: Vec<usize> = (0..BATCH).map(|_| next() as usize % cmds.len()).collect();
        let mut bytes = Vec::new();
        for &i in &picks {
            encode(&cmds[i], &mut bytes);
            seen.sent[i] += 1;
        }
        if writer.write_all(&bytes).is_err() {
            return seen;
        }
        for &i in &picks {
            let Some(reply) = read_reply(&mut reader) else {
                return seen;
            };
            if reply[0] == 1 {
                seen.granted[i].push(Instant::now());
            } else {
                seen.denied[i] += 1;
            }
            replies.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// One round's figures for the everysec report.
struct Round {
    received: u64,
    lost: u64,
    /// How long before the kill the oldest lost grant arrived.
    lost_span: Duration,
    load_time: Duration,
    /// INFO `aof_buffer_length` and `aof_pending_bio_fsync` just before the kill.
    pending: String,
}

/// Runs `rounds` rounds on one server started with `extra`: load, SIGKILL
/// after `run_for` (a range in ms, picked per round), restart on the AOF,
/// then checks per limiter that the state holds no more grants than calls
/// were sent and, with `lossless`, at least every grant the client received.
/// Without `lossless` it checks that the grants lost are among those
/// received in the last `LOSS_WINDOW` before the kill. Every round also checks that
/// the limiters of earlier rounds came back unchanged.
fn crash_rounds(extra: &[&str], rounds: usize, run_for: (u64, u64), lossless: bool) -> Vec<Round> {
    let mut server = Server::start_with(extra);
    let mut con = server.conn();
    // Day windows (UTC days): none may end during the test.
    avoid_boundary(&mut con, 86_400_000, 60_000);
    let mut next = xorshift(0xc4a5_4e55);
    let mut results = Vec::new();
    // (key, limit, grants in the state) of every earlier round.
    let mut earlier: Vec<(String, u64, u64)> = Vec::new();
    for round in 0..rounds {
        let limiters = limiters(round);
        let cmds: Vec<Vec<String>> = limiters.iter().map(|l| l.cmd.clone()).collect();
        let replies = Arc::new(AtomicU64::new(0));
        let client = {
            let (port, replies, seed) = (server.port, replies.clone(), next());
            thread::spawn(move || load(port, cmds, seed, replies))
        };
        // Let the load get going, then kill at a random moment in `run_for`.
        let deadline = Instant::now() + Duration::from_secs(20);
        while replies.load(Ordering::Relaxed) < 2000 {
            assert!(Instant::now() < deadline, "the load did not start");
            sleep(Duration::from_millis(5));
        }
        let started = Instant::now();
        sleep(Duration::from_millis(
            run_for.0 + next() % (run_for.1 - run_for.0),
        ));
        // What the server had not yet written to the AOF just before the
        // kill: with everysec it puts writes off while a background fsync
        // runs (up to 2 s) and answers clients meanwhile; a SIGKILL loses
        // what is put off (what is written survives in the page cache).
        let text = info(&mut con, "persistence");
        let pending = ["aof_buffer_length", "aof_pending_bio_fsync"]
            .map(|name| format!("{name} {}", field(&text, name).unwrap_or_default()))
            .join(", ");
        let killed_at = Instant::now();
        server.sigkill();
        let seen = client.join().expect("client thread");
        server.restart(Shutdown::NoSave);
        con = server.conn();

        let state = |con: &mut redis::Connection, key: &str, limit: u64| -> u64 {
            match q(con, &argv!["RL.PEEK", key]) {
                redis::Value::Nil => 0,
                v => limit - Reply::parse(&v).remaining as u64,
            }
        };
        let mut received_total = 0;
        let mut lost_total = 0;
        let mut lost_span = Duration::ZERO;
        for (i, l) in limiters.iter().enumerate() {
            let held = state(&mut con, &l.key, l.limit);
            let received = seen.granted[i].len() as u64;
            let sent = seen.sent[i];
            assert!(
                held <= sent,
                "round {round}, {}: the state holds {held} grants, only {sent} calls were sent",
                l.key
            );
            assert!(received <= l.limit, "{}: granted past its limit", l.key);
            let lost = received.saturating_sub(held);
            if lossless {
                assert_eq!(
                    lost, 0,
                    "round {round}, {}: {received} grants received, the state after the crash holds {held}",
                    l.key
                );
            } else if lost > 0 {
                // The AOF is a prefix of what was done: the lost grants are the last ones.
                let oldest_lost = seen.granted[i][(received - lost) as usize];
                lost_span = lost_span.max(killed_at - oldest_lost);
                let recent = seen.granted[i]
                    .iter()
                    .filter(|t| killed_at - **t <= LOSS_WINDOW)
                    .count() as u64;
                assert!(
                    lost <= recent,
                    "round {round}, {}: {lost} grants lost, only {recent} were received in the {LOSS_WINDOW:?} before the kill",
                    l.key
                );
            }
            if l.limit == SMALL {
                assert!(
                    seen.denied[i] > 0,
                    "round {round}, {}: a small limiter should deny",
                    l.key
                );
            }
            received_total += received;
            lost_total += lost;
            earlier.push((l.key.clone(), l.limit, held));
        }
        // The limiters of earlier rounds came back as they were.
        for (key, limit, held) in &earlier {
            assert_eq!(
                state(&mut con, key, *limit),
                *held,
                "after round {round}: {key} changed across a restart"
            );
        }
        results.push(Round {
            received: received_total,
            lost: lost_total,
            lost_span,
            load_time: killed_at - started,
            pending,
        });
    }
    results
}

/// `appendfsync always`: every grant a client received survives a SIGKILL.
#[test]
fn appendfsync_always_loses_no_grant_on_sigkill() {
    let args = ["--appendonly", "yes", "--appendfsync", "always"];
    for (i, r) in crash_rounds(&args, 4, (100, 600), true).iter().enumerate() {
        eprintln!(
            "always, round {i}: {} grants received in {:?} before the kill, {} lost",
            r.received, r.load_time, r.lost
        );
    }
}

/// `appendfsync everysec`: a SIGKILL loses at most the grants of the last
/// second or two: those the server answered while it put the AOF write off
/// behind a slow background fsync. (What it has written but not fsynced
/// survives a process kill; an OS crash would lose up to a second more.)
/// Rounds of 4-5 s, so that the bound excludes most of a round's grants.
/// Prints what was lost.
#[test]
fn appendfsync_everysec_loses_at_most_the_last_two_seconds() {
    let args = ["--appendonly", "yes", "--appendfsync", "everysec"];
    let results = crash_rounds(&args, 3, (4000, 5000), false);
    for (i, r) in results.iter().enumerate() {
        let lost = match r.lost {
            0 => "none lost".to_string(),
            n => format!(
                "{n} lost, the oldest received {:?} before the kill",
                r.lost_span
            ),
        };
        eprintln!(
            "everysec, round {i}: {} grants received in {:?} before the kill, {lost} (just before it: {})",
            r.received, r.load_time, r.pending
        );
    }
}
