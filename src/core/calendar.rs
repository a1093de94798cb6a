//! Calendar periods: the local day, week, month or year that holds a moment,
//! in UTC or an IANA time zone, as two instants [start, end). A day across a
//! daylight-saving change lasts 23 or 25 hours; a month 28 to 31 days; a
//! monthly period anchored on the 29th to 31st starts on the month's last day
//! in shorter months, as billing systems do.
//!
//! The zone rules are jiff's bundled copy of the IANA database (built into
//! the module), so every node running one build computes the same
//! boundaries. Even so a boundary is computed once, by the node that opens
//! the period, and stored with the limiter: replicas, AOF replay and later
//! loads read it and never consult their own zone data.

use jiff::civil::{Date, Weekday};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

use super::bounds::{self, MAX_TIME};
use super::Millis;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Unit {
    Day = 1,
    Week = 2,
    Month = 3,
    Year = 4,
}

impl Unit {
    pub fn from_u8(value: u8) -> Option<Unit> {
        match value {
            1 => Some(Unit::Day),
            2 => Some(Unit::Week),
            3 => Some(Unit::Month),
            4 => Some(Unit::Year),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// The anchors this unit takes: the first day of a week (1 Monday to 7
    /// Sunday), the day a month starts on (1 to 31); days and years take
    /// none (0).
    pub fn anchors(self) -> std::ops::RangeInclusive<u8> {
        match self {
            Unit::Day | Unit::Year => 0..=0,
            Unit::Week => 1..=7,
            Unit::Month => 1..=31,
        }
    }

    pub fn default_anchor(self) -> u8 {
        match self {
            Unit::Day | Unit::Year => 0,
            Unit::Week | Unit::Month => 1,
        }
    }

    /// The longest period of this unit: what a period is cut to when the
    /// zone database cannot place it (past the year 9999).
    fn longest(self) -> Millis {
        let day = 86_400_000;
        Millis(match self {
            Unit::Day => day + 3_600_000,
            Unit::Week => 7 * day + 3_600_000,
            Unit::Month => 31 * day + 3_600_000,
            Unit::Year => 366 * day + 3_600_000,
        })
    }
}

/// The longest period any calendar has, with room for a zone that changes
/// its offset by a whole day in one (as Samoa did on 2011-12-30): the
/// loader's bound on `end - start`.
pub const MAX_CALENDAR_PERIOD: Millis = Millis(368 * 86_400_000);

/// The longest zone name stored (the IANA database's longest is 32 bytes).
pub const MAX_ZONE_NAME: usize = 40;

/// A zone name, stored inline so that a policy stays `Copy`: "UTC" or an
/// IANA name such as `Europe/Berlin`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ZoneName {
    len: u8,
    bytes: [u8; MAX_ZONE_NAME],
}

impl std::fmt::Debug for ZoneName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

impl ZoneName {
    pub const UTC: ZoneName = ZoneName {
        len: 3,
        bytes: *b"UTC\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0",
    };

    /// A name of the right shape (1 to 40 bytes of letters, digits and
    /// `/_+-`), whether or not this build knows the zone: the loader takes
    /// any such name, since the stored boundaries do not need the zone.
    pub fn from_bytes(text: &[u8]) -> Option<ZoneName> {
        let shaped = (1..=MAX_ZONE_NAME).contains(&text.len())
            && text
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || b"/_+-".contains(b));
        if !shaped {
            return None;
        }
        let mut bytes = [0u8; MAX_ZONE_NAME];
        bytes[..text.len()].copy_from_slice(text);
        Some(ZoneName {
            len: text.len() as u8,
            bytes,
        })
    }

    /// The zone's canonical name when this build knows it (`utc` is UTC,
    /// `europe/berlin` is `Europe/Berlin`), for commands.
    pub fn known(text: &[u8]) -> Option<ZoneName> {
        let name = std::str::from_utf8(text).ok()?;
        if name.eq_ignore_ascii_case("UTC") {
            return Some(ZoneName::UTC);
        }
        let zone = TimeZone::get(name).ok()?;
        ZoneName::from_bytes(zone.iana_name()?.as_bytes())
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).unwrap_or("UTC")
    }

    fn zone(&self) -> Option<TimeZone> {
        if *self == ZoneName::UTC {
            return Some(TimeZone::UTC);
        }
        TimeZone::get(self.as_str()).ok()
    }
}

/// A calendar: its unit, its anchor (see [`Unit::anchors`]) and its zone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Calendar {
    pub unit: Unit,
    pub anchor: u8,
    pub zone: ZoneName,
}

impl Calendar {
    pub fn is_valid(&self) -> bool {
        self.unit.anchors().contains(&self.anchor)
    }

    /// The period [start, end) that holds `now` (the clock as the core uses
    /// it, at most `MAX_TIME`): `start <= now < end`. Where the zone is
    /// unknown to this build or the date lies past jiff's range (the year
    /// 9999), the period is `now` plus the unit's longest length: never
    /// longer than a real one.
    pub fn period_at(&self, now: Millis) -> (Millis, Millis) {
        let now = bounds::clock(now);
        self.local_period(now)
            .filter(|(start, end)| {
                *start <= now && now < *end && end.0 - start.0 <= MAX_CALENDAR_PERIOD.0
            })
            .unwrap_or_else(|| (now, now.saturating_add(self.unit.longest())))
    }

    fn local_period(&self, now: Millis) -> Option<(Millis, Millis)> {
        let zone = self.zone.zone()?;
        let moment = Timestamp::from_millisecond(i64::try_from(now.0).ok()?).ok()?;
        let today = moment.to_zoned_datetime(zone.clone()).date();
        let (first, next) = match self.unit {
            Unit::Day => (today, today.tomorrow().ok()?),
            Unit::Week => {
                let first_day = Weekday::from_monday_one_offset(self.anchor as i8).ok()?;
                let back = today.weekday().since(first_day);
                let first = today.checked_add((-i64::from(back)).days()).ok()?;
                (first, first.checked_add(7.days()).ok()?)
            }
            Unit::Month => {
                let this = anchored(today.first_of_month(), self.anchor)?;
                if today >= this {
                    let next = today.first_of_month().checked_add(1.month()).ok()?;
                    (this, anchored(next, self.anchor)?)
                } else {
                    let previous = today.first_of_month().checked_add((-1).month()).ok()?;
                    (anchored(previous, self.anchor)?, this)
                }
            }
            Unit::Year => {
                let first = Date::new(today.year(), 1, 1).ok()?;
                (first, Date::new(today.year().checked_add(1)?, 1, 1).ok()?)
            }
        };
        Some((start_of(first, &zone)?, start_of(next, &zone)?))
    }
}

/// The day `anchor` of the month starting at `first`, or the month's last
/// day when it has fewer days.
fn anchored(first: Date, anchor: u8) -> Option<Date> {
    let day = (anchor as i8).min(first.days_in_month());
    Date::new(first.year(), first.month(), day).ok()
}

/// The first instant of a local day: midnight, or the end of a gap that
/// swallows midnight (a zone that springs forward at 00:00).
fn start_of(day: Date, zone: &TimeZone) -> Option<Millis> {
    let start = day.to_zoned_datetime(zone.clone()).ok()?.timestamp();
    let ms = u64::try_from(start.as_millisecond()).ok()?;
    (ms <= MAX_TIME.0 + MAX_CALENDAR_PERIOD.0).then_some(Millis(ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(text: &str) -> Millis {
        let ts: Timestamp = text.parse().unwrap();
        Millis(ts.as_millisecond() as u64)
    }

    fn period(unit: Unit, anchor: u8, zone: &str, at: &str) -> (Millis, Millis) {
        let calendar = Calendar {
            unit,
            anchor,
            zone: ZoneName::known(zone.as_bytes()).unwrap(),
        };
        calendar.period_at(ms(at))
    }

    const HOUR: u64 = 3_600_000;

    #[test]
    fn days_across_daylight_saving_changes() {
        // Berlin springs forward on 2026-03-29 (23 h) and falls back on
        // 2026-10-25 (25 h); New York on 2026-03-08 and 2026-11-01.
        for (zone, day, start, hours) in [
            (
                "Europe/Berlin",
                "2026-03-29T12:00:00Z",
                "2026-03-28T23:00:00Z",
                23,
            ),
            (
                "Europe/Berlin",
                "2026-10-25T12:00:00Z",
                "2026-10-24T22:00:00Z",
                25,
            ),
            (
                "Europe/Berlin",
                "2026-07-01T12:00:00Z",
                "2026-06-30T22:00:00Z",
                24,
            ),
            (
                "America/New_York",
                "2026-03-08T12:00:00Z",
                "2026-03-08T05:00:00Z",
                23,
            ),
            (
                "America/New_York",
                "2026-11-01T12:00:00Z",
                "2026-11-01T04:00:00Z",
                25,
            ),
            (
                "Australia/Sydney",
                "2026-04-05T12:00:00Z",
                "2026-04-04T13:00:00Z",
                25,
            ),
            ("UTC", "2026-03-29T12:00:00Z", "2026-03-29T00:00:00Z", 24),
        ] {
            let (s, e) = period(Unit::Day, 0, zone, day);
            assert_eq!(s, ms(start), "{zone} {day}");
            assert_eq!(e.0 - s.0, hours * HOUR, "{zone} {day}");
        }
    }

    #[test]
    fn a_day_whose_midnight_does_not_exist_starts_after_the_gap() {
        // America/Santiago springs forward at 24:00 on 2026-09-05: the 6th
        // starts at 01:00 local, 04:00 UTC.
        let (s, e) = period(Unit::Day, 0, "America/Santiago", "2026-09-06T12:00:00Z");
        assert_eq!(s, ms("2026-09-06T04:00:00Z"));
        assert_eq!(e, ms("2026-09-07T03:00:00Z"));
    }

    #[test]
    fn months_with_anchor_days() {
        let utc = |at| period(Unit::Month, 31, "UTC", at);
        // Anchored on the 31st: February's period starts on the 28th (29th
        // in a leap year), April's on the 30th.
        assert_eq!(
            utc("2026-02-15T00:00:00Z"),
            (ms("2026-01-31T00:00:00Z"), ms("2026-02-28T00:00:00Z"))
        );
        assert_eq!(
            utc("2026-02-28T00:00:00Z"),
            (ms("2026-02-28T00:00:00Z"), ms("2026-03-31T00:00:00Z"))
        );
        assert_eq!(
            utc("2028-02-29T10:00:00Z"),
            (ms("2028-02-29T00:00:00Z"), ms("2028-03-31T00:00:00Z"))
        );
        assert_eq!(
            utc("2026-04-30T23:59:59Z"),
            (ms("2026-04-30T00:00:00Z"), ms("2026-05-31T00:00:00Z"))
        );
        let first = |at| period(Unit::Month, 1, "UTC", at);
        assert_eq!(
            first("2026-12-31T23:59:59.999Z"),
            (ms("2026-12-01T00:00:00Z"), ms("2027-01-01T00:00:00Z"))
        );
        assert_eq!(
            first("2027-01-01T00:00:00Z"),
            (ms("2027-01-01T00:00:00Z"), ms("2027-02-01T00:00:00Z"))
        );
        // A local month in New York: its first starts at 05:00 UTC (EST).
        assert_eq!(
            period(Unit::Month, 1, "America/New_York", "2026-12-01T03:00:00Z"),
            (ms("2026-11-01T04:00:00Z"), ms("2026-12-01T05:00:00Z"))
        );
    }

    #[test]
    fn weeks_start_on_the_chosen_day() {
        // 2026-12-04 is a Friday.
        assert_eq!(
            period(Unit::Week, 1, "UTC", "2026-12-04T12:00:00Z"),
            (ms("2026-11-30T00:00:00Z"), ms("2026-12-07T00:00:00Z"))
        );
        assert_eq!(
            period(Unit::Week, 7, "UTC", "2026-12-04T12:00:00Z"),
            (ms("2026-11-29T00:00:00Z"), ms("2026-12-06T00:00:00Z"))
        );
        assert_eq!(
            period(Unit::Week, 5, "UTC", "2026-12-04T00:00:00Z"),
            (ms("2026-12-04T00:00:00Z"), ms("2026-12-11T00:00:00Z"))
        );
        // A week across Berlin's autumn change lasts 7 days and 1 hour.
        let (s, e) = period(Unit::Week, 1, "Europe/Berlin", "2026-10-25T12:00:00Z");
        assert_eq!(e.0 - s.0, 7 * 24 * HOUR + HOUR);
    }

    #[test]
    fn years_and_leap_days() {
        assert_eq!(
            period(Unit::Year, 0, "UTC", "2028-02-29T12:00:00Z"),
            (ms("2028-01-01T00:00:00Z"), ms("2029-01-01T00:00:00Z"))
        );
        let (s, e) = period(Unit::Year, 0, "Asia/Tokyo", "2026-06-01T00:00:00Z");
        assert_eq!(s, ms("2025-12-31T15:00:00Z"));
        assert_eq!(e.0 - s.0, 365 * 24 * HOUR);
    }

    #[test]
    fn every_period_holds_its_moment_up_to_the_latest_time() {
        let zones = ["UTC", "Europe/Berlin", "Pacific/Apia", "America/Santiago"];
        let units = [
            (Unit::Day, 0),
            (Unit::Week, 3),
            (Unit::Month, 30),
            (Unit::Year, 0),
        ];
        let mut moment = 0u64;
        while moment <= MAX_TIME.0 {
            for zone in zones {
                for (unit, anchor) in units {
                    let calendar = Calendar {
                        unit,
                        anchor,
                        zone: ZoneName::known(zone.as_bytes()).unwrap(),
                    };
                    let (s, e) = calendar.period_at(Millis(moment));
                    assert!(s.0 <= moment && moment < e.0, "{zone} {unit:?} {moment}");
                    assert!(e.0 - s.0 <= MAX_CALENDAR_PERIOD.0);
                }
            }
            moment = moment * 3 + 86_399_999;
        }
    }

    #[test]
    fn zone_names() {
        assert_eq!(ZoneName::known(b"utc"), Some(ZoneName::UTC));
        assert_eq!(
            ZoneName::known(b"Europe/Berlin").unwrap().as_str(),
            "Europe/Berlin"
        );
        assert_eq!(ZoneName::known(b"Mars/Olympus"), None);
        assert_eq!(ZoneName::known(b"../etc/passwd"), None);
        assert!(ZoneName::from_bytes(b"Mars/Olympus").is_some());
        assert!(ZoneName::from_bytes(b"").is_none());
        assert!(ZoneName::from_bytes(b"a b").is_none());
    }
}
