//! Sliding log: exact. A request is allowed while the cost logged in the last
//! `period` + its cost <= `limit`; there is no window edge to exploit.
//!
//! Compactness: entries are (time, count) pairs, delta-encoded as varints in
//! one byte buffer: `gap << 1 | (count != 1)`, then the count when it is not 1.
//! A request of cost 1 a few hundred milliseconds after the previous one takes
//! 2 bytes. Requests in the same millisecond share an entry.
//!
//! Boundedness: by default only allowed requests are logged, so the live cost
//! never exceeds `limit`. With COUNTDENIED denied requests are logged too; an
//! entry is then dropped as soon as the entries after it already exceed
//! `limit` on their own: while it is in the window they are too, so every
//! decision stays the same without it. Either way the log holds at most
//! `limit + 1` entries.

use super::bounds::clock;
use super::{until, varint, Millis, Outcome, RetryAfter, MAX_COUNT};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogParams {
    pub limit: u64,
    pub period: Millis,
}

#[derive(Clone, Debug)]
pub struct SlidingLog {
    pub params: LogParams,
    /// Time of the latest update (the newest entry's time when there is one);
    /// never moves backwards.
    last: Millis,
    /// Time of the oldest entry, the one at `head`.
    first: Millis,
    /// Sum of the counts of all entries in the buffer.
    total: u64,
    /// Byte offset of the oldest entry; the bytes before it are dead and are
    /// reclaimed once they outweigh the live ones.
    head: usize,
    /// Byte offset of the newest entry, rewritten when a request shares its millisecond.
    tail: usize,
    bytes: Vec<u8>,
}

/// Two logs are equal when they hold the same entries, whatever the layout
/// of their buffers (dead bytes, where the oldest entry starts).
impl PartialEq for SlidingLog {
    fn eq(&self, other: &SlidingLog) -> bool {
        self.params == other.params
            && self.last == other.last
            && self.total == other.total
            && self.entries().eq(other.entries())
    }
}

impl Eq for SlidingLog {}

/// The effect of one logged request: applying it is deterministic, so a
/// replica or an AOF replay reaches exactly the primary's log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogRecord {
    pub params: LogParams,
    pub at: Millis,
    pub cost: u64,
}

struct Entry {
    gap: u64,
    count: u64,
    end: usize,
}

fn encode(out: &mut Vec<u8>, gap: u64, count: u64) {
    varint::push(out, gap << 1 | u64::from(count != 1));
    if count != 1 {
        varint::push(out, count);
    }
}

fn decode(bytes: &[u8], at: usize) -> Option<Entry> {
    let mut pos = at;
    let word = varint::read(bytes, &mut pos)?;
    let count = if word & 1 == 1 {
        varint::read(bytes, &mut pos)?
    } else {
        1
    };
    Some(Entry {
        gap: word >> 1,
        count,
        end: pos,
    })
}

impl SlidingLog {
    pub fn new(params: LogParams) -> SlidingLog {
        SlidingLog {
            params,
            last: Millis::ZERO,
            first: Millis::ZERO,
            total: 0,
            head: 0,
            tail: 0,
            bytes: Vec::new(),
        }
    }

    pub fn last_update(&self) -> Millis {
        self.last
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn is_empty(&self) -> bool {
        self.head == self.bytes.len()
    }

    /// Heap bytes held (for MEMORY USAGE).
    pub fn heap_capacity(&self) -> usize {
        self.bytes.capacity()
    }

    /// Entries, oldest first, as (time, count). The buffer was produced by
    /// this code (or validated on load), so decoding cannot fail.
    pub fn entries(&self) -> impl Iterator<Item = (Millis, u64)> + '_ {
        let mut pos = self.head;
        let mut time = self.first;
        let mut is_first = true;
        std::iter::from_fn(move || {
            let entry = decode(&self.bytes, pos)?;
            if !is_first {
                time = time.saturating_add(Millis(entry.gap));
            }
            is_first = false;
            pos = entry.end;
            Some((time, entry.count))
        })
    }

    /// When the newest entry leaves the window: the key expires then.
    pub fn empty_at(&self) -> Millis {
        if self.is_empty() {
            self.last
        } else {
            self.last.saturating_add(self.params.period)
        }
    }

    /// Applies one logged request; see [`LogRecord`].
    pub fn apply(&mut self, record: LogRecord) {
        self.params = record.params;
        let at = record.at.max(self.last);
        while !self.is_empty() && self.first.saturating_add(self.params.period) <= at {
            self.pop_front();
        }
        if record.cost > 0 {
            self.push(at, record.cost);
        }
        self.last = at;
        while let Some(oldest) = decode(&self.bytes, self.head) {
            if self.total.saturating_sub(oldest.count) > self.params.limit {
                self.pop_front();
            } else {
                break;
            }
        }
        self.reclaim();
    }

    /// Appends an entry at `at` (>= every entry's time). An entry's count is
    /// capped at `limit + 1`: while it is in the window it alone denies every
    /// request, and a larger count would change no decision, only risk
    /// overflow (COUNTDENIED traffic in one millisecond).
    pub(crate) fn push(&mut self, at: Millis, count: u64) {
        let cap = self.params.limit.saturating_add(1);
        if self.is_empty() {
            self.bytes.clear();
            self.head = 0;
            self.tail = 0;
            self.first = at;
            self.total = count.min(cap);
            encode(&mut self.bytes, 0, self.total);
        } else if at == self.last {
            let newest = decode(&self.bytes, self.tail).unwrap_or(Entry {
                gap: 0,
                count: 0,
                end: self.tail,
            });
            // An entry already above the cap (written under a larger limit) keeps its count.
            let merged = newest
                .count
                .saturating_add(count)
                .min(cap.max(newest.count));
            self.bytes.truncate(self.tail);
            encode(&mut self.bytes, newest.gap, merged);
            self.total = self
                .total
                .saturating_sub(newest.count)
                .saturating_add(merged);
        } else {
            self.tail = self.bytes.len();
            encode(&mut self.bytes, at.0 - self.last.0, count.min(cap));
            self.total = self.total.saturating_add(count.min(cap));
        }
        self.last = at;
    }

    fn pop_front(&mut self) {
        let Some(oldest) = decode(&self.bytes, self.head) else {
            return;
        };
        self.total = self.total.saturating_sub(oldest.count);
        self.head = oldest.end;
        match decode(&self.bytes, self.head) {
            Some(next) => self.first = self.first.saturating_add(Millis(next.gap)),
            None => {
                self.bytes.clear();
                self.head = 0;
                self.tail = 0;
            }
        }
    }

    /// Drops dead bytes once they are at least half the buffer, and gives
    /// back capacity the log no longer needs: O(1) amortised per request.
    fn reclaim(&mut self) {
        if self.head > 0 && self.head * 2 >= self.bytes.len() {
            self.bytes.drain(..self.head);
            self.tail -= self.head;
            self.head = 0;
        }
        if self.bytes.capacity() > 64 && self.bytes.capacity() > self.bytes.len() * 4 {
            self.bytes.shrink_to(self.bytes.len() * 2);
        }
    }

    /// Gives back up to `amount` of the most recently logged cost that is
    /// still in the window at `at`, newest entries first; returns how much.
    /// Entries that left the window give nothing back. Deterministic in
    /// (log, at, amount), so replicas replay it exactly (`Effect::LogRefund`).
    /// O(entries): refunds are rare next to requests.
    pub fn refund(&mut self, at: Millis, amount: u64) -> u64 {
        let at = at.max(self.last);
        let period = self.params.period;
        let mut entries: Vec<(Millis, u64)> = self.entries().collect();
        let mut left = amount;
        while let Some(newest) = entries.last_mut() {
            if left == 0 || newest.0.saturating_add(period) <= at {
                break;
            }
            let take = left.min(newest.1);
            newest.1 -= take;
            left -= take;
            if newest.1 == 0 {
                entries.pop();
            }
        }
        let given = amount - left;
        // The newest remaining entry's time becomes the latest update, as
        // the stored form requires.
        let last = entries.last().map_or(self.last, |e| e.0);
        match SlidingLog::from_entries(self.params, last, entries) {
            Some(log) if given > 0 => {
                *self = log;
                given
            }
            _ => 0,
        }
    }

    /// Rebuilds a log from its entries (oldest first), exactly as they were
    /// (an entry written under a larger limit keeps its count); `None` when
    /// they are not strictly increasing in time, a count is 0 or above any
    /// count this code writes, or the entries after the oldest exceed the
    /// limit (`apply` would have dropped the oldest).
    pub fn from_entries(
        params: LogParams,
        last: Millis,
        entries: impl IntoIterator<Item = (Millis, u64)>,
    ) -> Option<SlidingLog> {
        let mut log = SlidingLog::new(params);
        let mut previous: Option<Millis> = None;
        for (time, count) in entries {
            if count == 0 || count > MAX_COUNT + 1 || previous.is_some_and(|p| time <= p) {
                return None;
            }
            let total = log.total.checked_add(count)?;
            if log.is_empty() {
                log.first = time;
                encode(&mut log.bytes, 0, count);
            } else {
                log.tail = log.bytes.len();
                encode(&mut log.bytes, time.0 - log.last.0, count);
            }
            log.total = total;
            log.last = time;
            previous = Some(time);
        }
        if previous.is_some_and(|p| p != last) {
            return None;
        }
        // `apply` always leaves the entries after the oldest within the limit
        // (the rest would have been dropped); this also bounds the total far
        // below u64::MAX, so no sum over the log can saturate.
        if let Some(oldest) = decode(&log.bytes, log.head) {
            if log.total - oldest.count > params.limit {
                return None;
            }
        }
        log.last = last;
        Some(log)
    }
}

/// Decides a request of `cost` at `now`. Returns the outcome and, when the
/// request is logged, the record to apply.
pub fn decide(
    state: Option<&SlidingLog>,
    params: LogParams,
    now: Millis,
    cost: u64,
    count_denied: bool,
) -> (Outcome, Option<LogRecord>) {
    let now = clock(now);
    let empty;
    let log = match state {
        Some(log) => log,
        None => {
            empty = SlidingLog::new(params);
            &empty
        }
    };
    let limit = params.limit;
    let period = params.period;
    let at = now.max(log.last);
    let expires = |time: Millis| time.saturating_add(period);

    // One pass: sum the expired prefix, and keep the iterator at the first
    // live entry for the retry walk below.
    let mut live = log.entries().peekable();
    let mut live_total = log.total;
    while let Some((_, count)) = live.next_if(|(time, _)| expires(*time) <= at) {
        live_total = live_total.saturating_sub(count);
    }

    // A peek (cost 0) is always granted, even over a lowered limit.
    let allowed = cost == 0 || (cost <= limit && live_total.saturating_add(cost) <= limit);
    let logged = cost > 0 && (allowed || (count_denied && cost <= limit));
    let total_after = live_total.saturating_add(if logged { cost } else { 0 });
    let newest = if logged {
        Some(at)
    } else if live_total > 0 {
        Some(log.last)
    } else {
        None
    };

    let retry_after = if allowed {
        RetryAfter::After(Millis::ZERO)
    } else if cost > limit {
        RetryAfter::Never
    } else {
        // The oldest entries must leave until `cost` fits.
        let must_leave = total_after.saturating_add(cost) - limit;
        let mut left = 0u64;
        let mut ready = newest.map(expires).unwrap_or(at);
        for (time, count) in live.by_ref() {
            left = left.saturating_add(count);
            if left >= must_leave {
                ready = expires(time);
                break;
            }
        }
        RetryAfter::After(until(ready, now))
    };
    let outcome = Outcome {
        allowed,
        limit,
        remaining: limit.saturating_sub(total_after),
        retry_after,
        reset_after: newest.map_or(Millis::ZERO, |time| until(expires(time), now)),
    };
    let record = logged.then_some(LogRecord { params, at, cost });
    (outcome, record)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(limit: u64, period: u64) -> LogParams {
        LogParams {
            limit,
            period: Millis(period),
        }
    }

    fn run(log: &mut SlidingLog, now: u64, cost: u64, count_denied: bool) -> Outcome {
        let (out, record) = decide(Some(log), log.params, Millis(now), cost, count_denied);
        if let Some(record) = record {
            log.apply(record);
        }
        out
    }

    #[test]
    fn no_burst_across_a_window_edge() {
        let mut log = SlidingLog::new(params(10, 60_000));
        assert!(run(&mut log, 59_999, 10, false).allowed);
        let out = run(&mut log, 60_000, 1, false);
        assert!(!out.allowed);
        assert_eq!(out.retry_after, RetryAfter::After(Millis(59_999)));
        assert!(!run(&mut log, 119_998, 1, false).allowed);
        assert!(run(&mut log, 119_999, 10, false).allowed);
    }

    #[test]
    fn count_denied_keeps_a_hammering_client_out() {
        let mut log = SlidingLog::new(params(2, 1000));
        run(&mut log, 0, 2, true);
        for now in (100..3000).step_by(100) {
            assert!(!run(&mut log, now, 1, true).allowed, "at {now}");
        }
        assert!(run(&mut log, 3900, 1, true).allowed);
    }

    #[test]
    fn count_denied_memory_stays_bounded() {
        let mut log = SlidingLog::new(params(3, 1_000_000));
        for now in 0..10_000 {
            run(&mut log, now, 1, true);
        }
        assert!(log.entries().count() <= 4);
    }

    #[test]
    fn same_millisecond_shares_an_entry() {
        let mut log = SlidingLog::new(params(100, 1000));
        for _ in 0..5 {
            run(&mut log, 7, 1, false);
        }
        assert_eq!(log.entries().collect::<Vec<_>>(), vec![(Millis(7), 5)]);
    }

    #[test]
    fn stays_under_ten_bytes_an_entry() {
        let mut log = SlidingLog::new(params(10_000, 3_600_000));
        for i in 0..10_000u64 {
            assert!(run(&mut log, i * 360, 1, false).allowed);
        }
        assert!(
            log.heap_capacity() <= 10 * 10_000,
            "{}",
            log.heap_capacity()
        );
    }

    #[test]
    fn from_entries_refuses_unordered_or_empty_counts() {
        let p = params(10, 1000);
        assert!(SlidingLog::from_entries(p, Millis(5), [(Millis(5), 1), (Millis(5), 1)]).is_none());
        assert!(SlidingLog::from_entries(p, Millis(5), [(Millis(5), 0)]).is_none());
        assert!(SlidingLog::from_entries(p, Millis(9), [(Millis(5), 1)]).is_none());
        let log = SlidingLog::from_entries(p, Millis(9), [(Millis(5), 1), (Millis(9), 3)]).unwrap();
        assert_eq!(log.total(), 4);
    }
}
