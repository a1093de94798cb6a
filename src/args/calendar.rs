//! The calendar of a calendar window: `RL.WINDOW key limit <unit> [TZ zone]
//! [ANCHOR day]`, where the unit word (`day`, `week`, `month`, `year`)
//! stands where a duration would, and TZ and ANCHOR follow it in either
//! order.

use super::words::{parse_u64, quoted, ArgError, Args};
use crate::core::calendar::{Calendar, Unit, ZoneName};

/// The unit a period word names, if it names one (any case).
pub fn unit(word: &[u8]) -> Option<Unit> {
    [Unit::Day, Unit::Week, Unit::Month, Unit::Year]
        .into_iter()
        .find(|u| word.eq_ignore_ascii_case(u.name().as_bytes()))
}

const WEEKDAYS: [&str; 7] = [
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
];

fn anchor(unit: Unit, text: &[u8]) -> Result<u8, ArgError> {
    let value = match unit {
        Unit::Week => WEEKDAYS
            .iter()
            .position(|d| {
                text.eq_ignore_ascii_case(d.as_bytes())
                    || text.eq_ignore_ascii_case(&d.as_bytes()[..3])
            })
            .map(|i| i as u64 + 1)
            .or_else(|| parse_u64(text)),
        Unit::Month => parse_u64(text),
        Unit::Day | Unit::Year => {
            return Err(ArgError(
                "ERR ANCHOR applies to week (the first day of the week) and month (the day a month starts on), not to day or year".into(),
            ))
        }
    };
    let what = match unit {
        Unit::Week => "a day of the week (monday to sunday, mon to sun, or 1 to 7)",
        _ => "a day of the month from 1 to 31 (29 to 31 fall on a shorter month's last day)",
    };
    value
        .and_then(|v| u8::try_from(v).ok())
        .filter(|v| unit.anchors().contains(v))
        .ok_or_else(|| ArgError(format!("ERR ANCHOR must be {what}, not '{}'", quoted(text))))
}

/// The calendar whose unit word is at `at`, then TZ and ANCHOR if they
/// follow; returns it and how many words it took (the unit's included).
pub fn calendar_at(args: &(impl Args + ?Sized), at: usize) -> Result<(Calendar, usize), ArgError> {
    let unit = unit(args.get(at)).ok_or_else(|| ArgError("ERR not a calendar unit".into()))?;
    let mut calendar = Calendar {
        unit,
        anchor: unit.default_anchor(),
        zone: ZoneName::UTC,
    };
    let (mut zone_seen, mut anchor_seen) = (false, false);
    let mut i = at + 1;
    while i < args.count() {
        let word = args.get(i);
        let is_tz = word.eq_ignore_ascii_case(b"TZ");
        if !is_tz && !word.eq_ignore_ascii_case(b"ANCHOR") {
            break;
        }
        let name = if is_tz { "TZ" } else { "ANCHOR" };
        if std::mem::replace(
            if is_tz {
                &mut zone_seen
            } else {
                &mut anchor_seen
            },
            true,
        ) {
            return Err(ArgError(format!(
                "ERR option {name} is given more than once"
            )));
        }
        let Some(value) = (i + 1 < args.count()).then(|| args.get(i + 1)) else {
            return Err(ArgError(format!("ERR {name} must be followed by a value")));
        };
        if is_tz {
            calendar.zone = ZoneName::known(value).ok_or_else(|| {
                ArgError(format!(
                    "ERR TZ must be UTC or an IANA time zone such as Europe/Berlin or America/New_York, not '{}'",
                    quoted(value)
                ))
            })?;
        } else {
            calendar.anchor = anchor(unit, value)?;
        }
        i += 2;
    }
    Ok((calendar, i - at))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(words: &str) -> Result<(Calendar, usize), ArgError> {
        let args: Vec<&[u8]> = words.split(' ').map(str::as_bytes).collect();
        calendar_at(args.as_slice(), 0)
    }

    #[test]
    fn units_zones_and_anchors() {
        let (c, used) = parse("Month TZ europe/berlin ANCHOR 31 COST 2").unwrap();
        assert_eq!(
            (c.unit, c.anchor, c.zone.as_str(), used),
            (Unit::Month, 31, "Europe/Berlin", 5)
        );
        let (c, used) = parse("week anchor sun").unwrap();
        assert_eq!(
            (c.unit, c.anchor, c.zone, used),
            (Unit::Week, 7, ZoneName::UTC, 3)
        );
        assert_eq!(parse("week ANCHOR 1").unwrap().0.anchor, 1);
        assert_eq!(
            parse("day").unwrap(),
            (
                Calendar {
                    unit: Unit::Day,
                    anchor: 0,
                    zone: ZoneName::UTC
                },
                1
            )
        );
    }

    #[test]
    fn errors_name_the_argument() {
        let err = |w| parse(w).unwrap_err().0;
        assert!(err("month TZ Mars/Olympus").starts_with("ERR TZ must be UTC or an IANA"));
        assert!(err("month ANCHOR 32").starts_with("ERR ANCHOR must be a day of the month"));
        assert!(err("month ANCHOR 0").starts_with("ERR ANCHOR must be a day of the month"));
        assert!(err("week ANCHOR funday").starts_with("ERR ANCHOR must be a day of the week"));
        assert!(err("day ANCHOR 1").starts_with("ERR ANCHOR applies to week"));
        assert!(err("month TZ UTC TZ UTC").starts_with("ERR option TZ is given more than once"));
        assert!(err("month TZ").starts_with("ERR TZ must be followed"));
    }
}
