//! Argument parsing for the RL commands: pure, allocation-free on success, and
//! every error names the argument it is about.

mod calendar;
mod words;

use std::fmt::{self, Display};

use crate::core::calendar_window::CalendarParams;
use crate::core::gcra::{GcraParams, Interval, ParamError};
use crate::core::lease::{LeaseId, LeaseParams, MAX_LEASE_LIMIT};
use crate::core::policy::{PerLimiter, Policy, Request};
use crate::core::sliding_log::LogParams;
use crate::core::token_bucket::TokenBucketParams;
use crate::core::window::WindowParams;
use crate::core::{Millis, MAX_COUNT, MAX_PERIOD, MIN_PERIOD};

use words::{is_keyword, quoted};
pub use words::{parse_u64, ArgError, Args};

const COUNT_RANGE: &str = "an integer from 1 to 1000000000000000";
const COST_RANGE: &str = "an integer from 0 to 1000000000000000";
const BLOCK_RANGE: &str =
    "0 (no timeout) or a duration from 1ms to 3650d (a bare integer is seconds)";
const LEASE_LIMIT_RANGE: &str = "an integer from 1 to 100000";
const LEASE_COST_RANGE: &str = "an integer from 0 to 100000 for a lease";
const DURATION_RANGE: &str = "a duration from 1ms to 3650d: an integer with an optional unit ms, s, m, h or d (a bare integer is seconds)";

fn must_be(name: impl Display, what: &str) -> ArgError {
    ArgError(format!("ERR {name} must be {what}"))
}

/// A parameter's name in errors: "limit", or "limit of limiter 2" in RL.ALL.
/// Formatted only when an error is built: the good path never allocates it.
#[derive(Clone, Copy)]
struct Param {
    name: &'static str,
    limiter: Option<usize>,
}

impl Display for Param {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.limiter {
            Some(n) => write!(f, "{} of limiter {n}", self.name),
            None => f.write_str(self.name),
        }
    }
}

fn count(text: &[u8], name: impl Display) -> Result<u64, ArgError> {
    parse_u64(text)
        .filter(|n| (1..=MAX_COUNT).contains(n))
        .ok_or_else(|| must_be(name, COUNT_RANGE))
}

/// `900`, `900s`, `15m`, `250ms`, `2h`, `1d`; a bare integer is seconds.
pub fn parse_duration(text: &[u8]) -> Option<Millis> {
    let digits = text.iter().take_while(|b| b.is_ascii_digit()).count();
    let (number, unit) = text.split_at(digits);
    let unit_is = |name: &[u8]| unit.eq_ignore_ascii_case(name);
    let scale: u64 = if unit.is_empty() || unit_is(b"s") {
        1000
    } else if unit_is(b"ms") {
        1
    } else if unit_is(b"m") {
        60_000
    } else if unit_is(b"h") {
        3_600_000
    } else if unit_is(b"d") {
        86_400_000
    } else {
        return None;
    };
    parse_u64(number)?
        .checked_mul(scale)
        .map(Millis)
        .filter(|ms| (MIN_PERIOD..=MAX_PERIOD).contains(ms))
}

fn duration(text: &[u8], name: impl Display) -> Result<Millis, ArgError> {
    parse_duration(text).ok_or_else(|| must_be(name, DURATION_RANGE))
}

/// The options every RL command takes, plus one flag of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Options {
    pub cost: u64,
    pub dry_run: bool,
    pub flag: bool,
    /// PARTIAL: grant min(COST, what is there) instead of all or nothing.
    pub partial: bool,
    /// LOCKOUT duration: a denied request locks the key for this long.
    pub lockout: Option<Millis>,
    /// BRIEF: reply one integer (0 allowed, else the wait in ms, -1 never).
    pub brief: bool,
    /// BLOCK timeout: wait for the permit up to this long instead of being
    /// denied; `Millis::ZERO` waits with no timeout (as XREAD BLOCK 0).
    pub block: Option<Millis>,
    /// The stored policy this call applies (RL.LIMIT), whose counters it
    /// adds to; set by the shell, never parsed.
    pub policy: Option<u64>,
}

impl Options {
    /// The request these options describe, for the core.
    pub fn request(&self) -> Request {
        Request {
            cost: self.cost,
            partial: self.partial,
            lockout: self.lockout,
        }
    }
}

/// The options a single-limiter command takes (after its own flag).
const LIMITER_OPTIONS: &[&str] = &["COST", "DRYRUN", "PARTIAL", "LOCKOUT", "BRIEF", "BLOCK"];
/// RL.ALL's: no BLOCK (waiting is for one limiter).
const ALL_OPTIONS: &[&str] = &["COST", "DRYRUN", "PARTIAL", "LOCKOUT", "BRIEF"];
/// RL.LEASE's.
const LEASE_OPTIONS: &[&str] = &["COST", "DRYRUN", "BLOCK"];

/// "A, B or C": the options an unknown option's error offers.
fn one_of(flag: Option<&str>, takes: &[&str]) -> String {
    let names: Vec<&str> = flag.into_iter().chain(takes.iter().copied()).collect();
    match names.split_last() {
        Some((last, [])) => (*last).to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// Parses the options from `first` on; `flag` is the command's own flag
/// (SLIDING, COUNTDENIED), if it has one; `takes` the options the command
/// takes, which an unknown option's error lists. An option of another
/// command is parsed all the same, for the caller to refuse with its reason.
fn options(
    args: &(impl Args + ?Sized),
    first: usize,
    flag: Option<&str>,
    takes: &[&str],
) -> Result<Options, ArgError> {
    let mut options = Options {
        cost: 1,
        ..Options::default()
    };
    let mut cost_seen = false;
    let mut i = first;
    while i < args.count() {
        let word = args.get(i);
        let is = |name: &str| is_keyword(word, name.as_bytes());
        let repeated = |name: &str| ArgError(format!("ERR option {name} is given more than once"));
        let value_of = |name: &str, what: &str| {
            if i + 1 < args.count() {
                Ok(args.get(i + 1))
            } else {
                Err(ArgError(format!("ERR {name} must be followed by {what}")))
            }
        };
        if is("COST") {
            if cost_seen {
                return Err(repeated("COST"));
            }
            options.cost = parse_u64(value_of("COST", COST_RANGE)?)
                .filter(|n| *n <= MAX_COUNT)
                .ok_or_else(|| must_be("COST", COST_RANGE))?;
            cost_seen = true;
            i += 2;
            continue;
        }
        if is("BLOCK") {
            if options.block.is_some() {
                return Err(repeated("BLOCK"));
            }
            let text = value_of("BLOCK", BLOCK_RANGE)?;
            options.block = Some(if text == b"0" {
                Millis::ZERO
            } else {
                parse_duration(text).ok_or_else(|| must_be("BLOCK", BLOCK_RANGE))?
            });
            i += 2;
            continue;
        }
        if is("LOCKOUT") {
            if options.lockout.is_some() {
                return Err(repeated("LOCKOUT"));
            }
            options.lockout = Some(duration(value_of("LOCKOUT", DURATION_RANGE)?, "LOCKOUT")?);
            i += 2;
            continue;
        }
        if is("DRYRUN") {
            if options.dry_run {
                return Err(repeated("DRYRUN"));
            }
            options.dry_run = true;
        } else if is("PARTIAL") {
            if options.partial {
                return Err(repeated("PARTIAL"));
            }
            options.partial = true;
        } else if is("BRIEF") {
            if options.brief {
                return Err(repeated("BRIEF"));
            }
            options.brief = true;
        } else if flag.is_some_and(is) {
            if options.flag {
                return Err(repeated(flag.unwrap_or_default()));
            }
            options.flag = true;
        } else {
            return Err(ArgError(format!(
                "ERR unknown option '{}' (expected {})",
                quoted(word),
                one_of(flag, takes)
            )));
        }
        i += 1;
    }
    if options.brief && options.partial {
        return Err(ArgError(
            "ERR BRIEF and PARTIAL cannot be combined (BRIEF replies one integer, without granted)"
                .into(),
        ));
    }
    if options.block.is_some() && (options.partial || options.lockout.is_some()) {
        return Err(ArgError(
            "ERR BLOCK cannot be combined with PARTIAL or LOCKOUT (a waiting request is granted whole, and is never denied while it waits)"
                .into(),
        ));
    }
    Ok(options)
}

/// `amount` of RL.REFUND.
pub fn amount(text: &[u8]) -> Result<u64, ArgError> {
    count(text, "amount")
}

fn need(args: &(impl Args + ?Sized), positional: usize, usage: &str) -> Result<(), ArgError> {
    if args.count() < positional {
        return Err(ArgError(format!("ERR wrong number of arguments: {usage}")));
    }
    Ok(())
}

/// `capacity refill_amount refill_period [COST n] [DRYRUN]`
pub fn token_bucket(args: &(impl Args + ?Sized)) -> Result<(TokenBucketParams, Options), ArgError> {
    need(
        args,
        3,
        "RL.TOKENBUCKET key capacity refill_amount refill_period [COST n] [DRYRUN]",
    )?;
    let params = TokenBucketParams {
        capacity: count(args.get(0), "capacity")?,
        refill_amount: count(args.get(1), "refill_amount")?,
        refill_period: duration(args.get(2), "refill_period")?,
    };
    Ok((params, options(args, 3, None, LIMITER_OPTIONS)?))
}

/// `limit period [SLIDING] [COST n] [DRYRUN]`, or a calendar window:
/// `limit day|week|month|year [TZ zone] [ANCHOR day] [COST n] [DRYRUN]`.
pub fn window(args: &(impl Args + ?Sized)) -> Result<(Policy, Options), ArgError> {
    need(
        args,
        2,
        "RL.WINDOW key limit period [SLIDING] [COST n] [DRYRUN], or RL.WINDOW key limit day|week|month|year [TZ zone] [ANCHOR day] [COST n] [DRYRUN]",
    )?;
    let limit = count(args.get(0), "limit")?;
    if calendar::unit(args.get(1)).is_some() {
        let (calendar, used) = calendar::calendar_at(args, 1)?;
        if (1 + used..args.count()).any(|i| args.get(i).eq_ignore_ascii_case(b"SLIDING")) {
            return Err(sliding_calendar());
        }
        let policy = Policy::Calendar(CalendarParams { limit, calendar });
        return Ok((policy, options(args, 1 + used, None, LIMITER_OPTIONS)?));
    }
    let params = WindowParams {
        limit,
        period: duration(args.get(1), "period")?,
    };
    let options = options(args, 2, Some("SLIDING"), LIMITER_OPTIONS)?;
    let sliding = options.flag;
    Ok((Policy::Window { params, sliding }, options))
}

fn sliding_calendar() -> ArgError {
    ArgError(
        "ERR SLIDING does not apply to a calendar window (day, week, month, year): its periods are the calendar's"
            .into(),
    )
}

/// `limit period [COUNTDENIED] [COST n] [DRYRUN]`; `flag` is COUNTDENIED.
pub fn sliding_log(args: &(impl Args + ?Sized)) -> Result<(LogParams, Options), ArgError> {
    need(
        args,
        2,
        "RL.SLIDINGLOG key limit period [COUNTDENIED] [COST n] [DRYRUN]",
    )?;
    let params = LogParams {
        limit: count(args.get(0), "limit")?,
        period: duration(args.get(1), "period")?,
    };
    let options = options(args, 2, Some("COUNTDENIED"), LIMITER_OPTIONS)?;
    if options.flag && options.block.is_some() {
        return Err(block_with_count_denied());
    }
    Ok((params, options))
}

/// `limit ttl [COST n] [DRYRUN] [BLOCK timeout]` (RL.LEASE).
pub fn lease(args: &(impl Args + ?Sized)) -> Result<(LeaseParams, Options), ArgError> {
    need(
        args,
        2,
        "RL.LEASE key limit ttl [COST n] [DRYRUN] [BLOCK timeout]",
    )?;
    let params = LeaseParams {
        limit: parse_u64(args.get(0))
            .filter(|n| (1..=MAX_LEASE_LIMIT).contains(n))
            .ok_or_else(|| must_be("limit", LEASE_LIMIT_RANGE))?,
        ttl: duration(args.get(1), "ttl")?,
    };
    // The shared option parser names the largest COST of the other
    // commands; a lease takes less.
    let options = options(args, 2, None, LEASE_OPTIONS)
        .map_err(|ArgError(message)| ArgError(message.replace(COST_RANGE, LEASE_COST_RANGE)))?;
    if options.partial || options.lockout.is_some() || options.brief {
        return Err(ArgError(
            "ERR RL.LEASE takes only COST, DRYRUN and BLOCK (PARTIAL, LOCKOUT and BRIEF do not apply to leases)"
                .into(),
        ));
    }
    if options.cost > MAX_LEASE_LIMIT {
        return Err(must_be("COST", LEASE_COST_RANGE));
    }
    Ok((params, options))
}

/// `lease_id` of RL.RELEASE and RL.EXTEND.
pub fn lease_id(text: &[u8]) -> Result<LeaseId, ArgError> {
    LeaseId::from_hex(text)
        .ok_or_else(|| must_be("lease_id", "16 hexadecimal digits, as RL.LEASE returned it"))
}

/// `ttl` of RL.EXTEND.
pub fn lease_ttl(text: &[u8]) -> Result<Millis, ArgError> {
    duration(text, "ttl")
}

fn gcra_params(params: GcraParams, burst_name: impl Display) -> Result<GcraParams, ArgError> {
    match params.check() {
        Ok(()) => Ok(params),
        Err(ParamError::RateTooHigh) => Err(ArgError(
            "ERR the rate must be at most one request per nanosecond of period (10^9 per second)"
                .to_string(),
        )),
        Err(ParamError::ToleranceTooLong) => Err(ArgError(format!(
            "ERR {burst_name} x period / rate must stay below 2^94 ns (about 627 billion years)"
        ))),
    }
}

/// `burst rate period [COST n] [DRYRUN]`
pub fn gcra(args: &(impl Args + ?Sized)) -> Result<(GcraParams, Options), ArgError> {
    need(args, 3, "RL.GCRA key burst rate period [COST n] [DRYRUN]")?;
    let params = GcraParams {
        limit: count(args.get(0), "burst")?,
        rate: count(args.get(1), "rate")?,
        period: duration(args.get(2), "period")?,
        interval: Interval::RoundUp,
    };
    Ok((
        gcra_params(params, "burst")?,
        options(args, 3, None, LIMITER_OPTIONS)?,
    ))
}

/// `max_burst count_per_period period [quantity]`, redis-cell's arguments
/// (CL.THROTTLE and RL.THROTTLE): the limit is `max_burst + 1`; a bare
/// period is seconds, as there, and units are accepted too.
pub fn throttle(
    args: &(impl Args + ?Sized),
    command: &str,
    interval: Interval,
) -> Result<(GcraParams, u64), ArgError> {
    if !(3..=4).contains(&args.count()) {
        return Err(ArgError(format!(
            "ERR wrong number of arguments: {command} key max_burst count_per_period period [quantity]"
        )));
    }
    let max_burst = parse_u64(args.get(0))
        .filter(|n| *n < MAX_COUNT)
        .ok_or_else(|| must_be("max_burst", "an integer from 0 to 999999999999999"))?;
    let params = GcraParams {
        limit: max_burst + 1,
        rate: count(args.get(1), "count_per_period")?,
        period: duration(args.get(2), "period")?,
        interval,
    };
    let quantity = if args.count() == 4 {
        parse_u64(args.get(3))
            .filter(|n| *n <= MAX_COUNT)
            .ok_or_else(|| must_be("quantity", COST_RANGE))?
    } else {
        1
    };
    Ok((gcra_params(params, "(max_burst + 1)")?, quantity))
}

/// The most limiters one RL.ALL call takes unless the config
/// `ratelimit.max-limiters` says otherwise.
pub const DEFAULT_MAX_LIMITERS: usize = 16;

const ALL_USAGE: &str = "RL.ALL numkeys key [key ...] limiter [limiter ...] [COST n] [DRYRUN], a limiter per key: TOKENBUCKET capacity refill_amount refill_period | WINDOW limit period [SLIDING] | WINDOW limit day|week|month|year [TZ zone] [ANCHOR day] | SLIDINGLOG limit period [COUNTDENIED] | GCRA burst rate period | POLICY name";

/// A stored policy by name (RL.ALL's `POLICY name`), from the shell: the
/// policy and the id its calls are counted under.
pub type PolicyLookup<'a> = &'a dyn Fn(&[u8]) -> Option<(Policy, u64)>;

/// RL.ALL's arguments.
#[derive(Debug, Default)]
pub struct AllArgs {
    pub numkeys: usize,
    /// The limiters, in key order.
    pub policies: PerLimiter<Policy>,
    /// For each limiter, the id of the stored policy it names, if it does.
    pub ids: PerLimiter<Option<u64>>,
    pub options: Options,
}

/// The word that starts a limiter in RL.ALL and RL.POLICY.SET.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AlgorithmWord {
    TokenBucket,
    Window,
    SlidingLog,
    Gcra,
}

/// Recognised once per limiter: RL.ALL asks this of every word after the
/// keys, and the parser then matches on the answer instead of comparing
/// the word again.
fn algorithm_word(word: &[u8]) -> Option<AlgorithmWord> {
    let (name, algorithm): (&[u8], _) = match word.len() {
        11 => (b"TOKENBUCKET", AlgorithmWord::TokenBucket),
        6 => (b"WINDOW", AlgorithmWord::Window),
        10 => (b"SLIDINGLOG", AlgorithmWord::SlidingLog),
        4 => (b"GCRA", AlgorithmWord::Gcra),
        _ => return None,
    };
    is_keyword(word, name).then_some(algorithm)
}

/// One limiter at `i` (its algorithm word first): the policy and how many
/// words it took. `limiter` numbers it in errors (RL.ALL); `lacking` is the
/// error when the command ends too soon.
fn limiter_at(
    args: &(impl Args + ?Sized),
    i: usize,
    algorithm: AlgorithmWord,
    limiter: Option<usize>,
    lacking: &dyn Fn() -> ArgError,
) -> Result<(Policy, usize), ArgError> {
    let name = |name: &'static str| Param { name, limiter };
    let positional = |j: usize| -> Result<&[u8], ArgError> {
        if i + j < args.count() {
            Ok(args.get(i + j))
        } else {
            Err(lacking())
        }
    };
    let flag_at =
        |j: usize, flag: &str| i + j < args.count() && is_keyword(args.get(i + j), flag.as_bytes());
    let (policy, used) = match algorithm {
        AlgorithmWord::TokenBucket => {
            let params = TokenBucketParams {
                capacity: count(positional(1)?, name("capacity"))?,
                refill_amount: count(positional(2)?, name("refill_amount"))?,
                refill_period: duration(positional(3)?, name("refill_period"))?,
            };
            (Policy::TokenBucket(params), 4)
        }
        AlgorithmWord::Window if calendar::unit(positional(2)?).is_some() => {
            let limit = count(positional(1)?, name("limit"))?;
            let (calendar, used) = calendar::calendar_at(args, i + 2)?;
            if flag_at(2 + used, "SLIDING") {
                return Err(sliding_calendar());
            }
            let policy = Policy::Calendar(CalendarParams { limit, calendar });
            (policy, 2 + used)
        }
        AlgorithmWord::Window => {
            let params = WindowParams {
                limit: count(positional(1)?, name("limit"))?,
                period: duration(positional(2)?, name("period"))?,
            };
            let sliding = flag_at(3, "SLIDING");
            (Policy::Window { params, sliding }, 3 + usize::from(sliding))
        }
        AlgorithmWord::SlidingLog => {
            let params = LogParams {
                limit: count(positional(1)?, name("limit"))?,
                period: duration(positional(2)?, name("period"))?,
            };
            let count_denied = flag_at(3, "COUNTDENIED");
            let policy = Policy::SlidingLog {
                params,
                count_denied,
            };
            (policy, 3 + usize::from(count_denied))
        }
        AlgorithmWord::Gcra => {
            let params = GcraParams {
                limit: count(positional(1)?, name("burst"))?,
                rate: count(positional(2)?, name("rate"))?,
                period: duration(positional(3)?, name("period"))?,
                interval: Interval::RoundUp,
            };
            (Policy::Gcra(gcra_params(params, name("burst"))?), 4)
        }
    };
    Ok((policy, used))
}

/// What `RL.POLICY.SET` takes.
pub const POLICY_SET_USAGE: &str = "RL.POLICY.SET name TOKENBUCKET capacity refill_amount refill_period | WINDOW limit period [SLIDING] | WINDOW limit day|week|month|year [TZ zone] [ANCHOR day] | SLIDINGLOG limit period [COUNTDENIED] | GCRA burst rate period [BRIEF]";
/// The longest policy name, in bytes.
pub const MAX_POLICY_NAME: usize = 128;

/// A policy's name: 1 to 128 bytes.
pub fn policy_name(text: &[u8]) -> Result<&[u8], ArgError> {
    if (1..=MAX_POLICY_NAME).contains(&text.len()) {
        Ok(text)
    } else {
        Err(must_be("the policy name", "1 to 128 bytes"))
    }
}

/// A stored policy: its limiter, and whether RL.LIMIT replies with BRIEF's
/// one integer (so the shortest call, `RL.LIMIT key policy`, is also the
/// cheapest reply).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PolicyDefinition {
    pub policy: Policy,
    pub brief: bool,
}

/// A stored policy's definition (`RL.POLICY.SET name` and what follows):
/// one limiter as RL.ALL takes it, then `BRIEF` or nothing.
pub fn policy_definition(args: &(impl Args + ?Sized)) -> Result<PolicyDefinition, ArgError> {
    let algorithm = (args.count() > 0)
        .then(|| algorithm_word(args.get(0)))
        .flatten();
    let Some(algorithm) = algorithm else {
        let found = if args.count() == 0 {
            "the end of the command".to_string()
        } else {
            format!("'{}'", quoted(args.get(0)))
        };
        return Err(ArgError(format!(
            "ERR a policy must start with TOKENBUCKET, WINDOW, SLIDINGLOG or GCRA, not {found}: {POLICY_SET_USAGE}"
        )));
    };
    let (policy, used) = limiter_at(args, 0, algorithm, None, &|| {
        ArgError(format!(
            "ERR the policy ({}) lacks arguments: {POLICY_SET_USAGE}",
            quoted(args.get(0))
        ))
    })?;
    let brief = used < args.count() && args.get(used).eq_ignore_ascii_case(b"BRIEF");
    let used = used + usize::from(brief);
    if used < args.count() {
        return Err(ArgError(format!(
            "ERR unexpected '{}' after the policy's parameters (a policy takes BRIEF; COST, DRYRUN and the other options are given to RL.LIMIT)",
            quoted(args.get(used))
        )));
    }
    Ok(PolicyDefinition { policy, brief })
}

/// The options of `RL.LIMIT key policy [options]`, for `definition`: those
/// of the algorithm's own command; a BRIEF policy replies BRIEF.
pub fn limit_options(
    args: &(impl Args + ?Sized),
    definition: &PolicyDefinition,
) -> Result<Options, ArgError> {
    let mut options = options(args, 0, None, LIMITER_OPTIONS)?;
    if let Policy::SlidingLog {
        count_denied: true, ..
    } = definition.policy
    {
        if options.block.is_some() {
            return Err(block_with_count_denied());
        }
    }
    if definition.brief {
        if options.partial {
            return Err(ArgError(
                "ERR PARTIAL needs the full reply (granted), and this policy replies BRIEF (one integer): define a policy without BRIEF for partial grants"
                    .into(),
            ));
        }
        options.brief = true;
    }
    Ok(options)
}

fn block_with_count_denied() -> ArgError {
    ArgError(
        "ERR BLOCK cannot be combined with COUNTDENIED (a waiting request is not denied, so there is nothing to count)"
            .into(),
    )
}

/// `numkeys key [key ...] limiter [limiter ...] [COST n] [DRYRUN]` (RL.ALL,
/// from numkeys on), parsed into `out` (its lists cleared first): filled
/// where the caller keeps it, as returning the lists would copy them, on
/// every call. Every error names the limiter and the argument it is about;
/// after one, `out` holds nothing meaningful.
pub fn all(
    args: &(impl Args + ?Sized),
    max_limiters: usize,
    stored: PolicyLookup,
    out: &mut AllArgs,
) -> Result<(), ArgError> {
    let numkeys = parse_u64(args.get(0))
        .filter(|n| (1..=max_limiters as u64).contains(n))
        .ok_or_else(|| {
            must_be(
                "numkeys",
                &format!("an integer from 1 to {max_limiters} (ratelimit.max-limiters)"),
            )
        })? as usize;
    if args.count() < 1 + numkeys {
        return Err(ArgError(format!(
            "ERR numkeys is {numkeys} but only {} keys follow: {ALL_USAGE}",
            args.count() - 1
        )));
    }
    out.numkeys = numkeys;
    let (policies, ids) = (&mut out.policies, &mut out.ids);
    policies.clear();
    ids.clear();
    let mut i = 1 + numkeys;
    while i < args.count() {
        let word = args.get(i);
        let algorithm = algorithm_word(word);
        let is_policy = algorithm.is_none() && is_keyword(word, b"POLICY");
        if algorithm.is_none() && !is_policy {
            break;
        }
        let n = policies.len() + 1;
        if n > numkeys {
            return Err(ArgError(format!(
                "ERR more limiters than keys (numkeys is {numkeys})"
            )));
        }
        let lacking = || {
            ArgError(format!(
                "ERR limiter {n} ({}) lacks arguments: {ALL_USAGE}",
                quoted(word)
            ))
        };
        let (policy, used) = match algorithm {
            None => {
                let name = if i + 1 < args.count() {
                    args.get(i + 1)
                } else {
                    return Err(lacking());
                };
                let (policy, id) = stored(name).ok_or_else(|| {
                    ArgError(format!(
                        "ERR no policy named '{}' on this node (limiter {n})",
                        quoted(name)
                    ))
                })?;
                ids.push(Some(id));
                (policy, 2)
            }
            Some(algorithm) => {
                ids.push(None);
                limiter_at(args, i, algorithm, Some(n), &lacking)?
            }
        };
        policies.push(policy);
        i += used;
    }
    if policies.len() < numkeys {
        let found = if i < args.count() {
            format!("'{}'", quoted(args.get(i)))
        } else {
            "the end of the command".to_string()
        };
        return Err(ArgError(format!(
            "ERR limiter {} must start with TOKENBUCKET, WINDOW, SLIDINGLOG, GCRA or POLICY, not {found} (numkeys is {numkeys})",
            policies.len() + 1
        )));
    }
    out.options = options(args, i, None, ALL_OPTIONS)?;
    if out.options.block.is_some() {
        return Err(ArgError(
            "ERR RL.ALL does not take BLOCK (waiting is for one limiter: RL.TOKENBUCKET, RL.GCRA, RL.WINDOW, RL.SLIDINGLOG, RL.LEASE)"
                .into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tb(words: &[&str]) -> Result<(TokenBucketParams, Options), ArgError> {
        let args: Vec<&[u8]> = words.iter().map(|w| w.as_bytes()).collect();
        token_bucket(args.as_slice())
    }

    fn err(result: Result<(TokenBucketParams, Options), ArgError>) -> String {
        result.unwrap_err().0
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration(b"900"), Some(Millis(900_000)));
        assert_eq!(parse_duration(b"15m"), Some(Millis(900_000)));
        assert_eq!(parse_duration(b"250ms"), Some(Millis(250)));
        assert_eq!(parse_duration(b"250MS"), Some(Millis(250)));
        assert_eq!(parse_duration(b"3650d"), Some(MAX_PERIOD));
        for bad in [
            "0",
            "0ms",
            "3651d",
            "1.5s",
            "-1",
            "s",
            "",
            "10 s",
            "1w",
            "99999999999999999999",
        ] {
            assert_eq!(parse_duration(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn options_in_any_order_and_case() {
        let (p, o) = tb(&["10", "1", "1s", "dryrun", "cost", "3"]).unwrap();
        assert_eq!(p.capacity, 10);
        assert_eq!(
            o,
            Options {
                cost: 3,
                dry_run: true,
                ..Options::default()
            }
        );
        assert_eq!(tb(&["10", "1", "1s"]).unwrap().1.cost, 1);
    }

    #[test]
    fn errors_name_the_argument() {
        assert!(err(tb(&["0", "1", "1s"])).starts_with("ERR capacity must be"));
        assert!(err(tb(&["1000000000000001", "1", "1s"])).starts_with("ERR capacity must be"));
        assert!(err(tb(&["10", "x", "1s"])).starts_with("ERR refill_amount must be"));
        assert!(err(tb(&["10", "1", "0"])).starts_with("ERR refill_period must be"));
        assert!(err(tb(&["10", "1", "1s", "COST"])).starts_with("ERR COST must be followed"));
        assert!(err(tb(&["10", "1", "1s", "COST", "-1"])).starts_with("ERR COST must be"));
        assert!(err(tb(&["10", "1", "1s", "COST", "1", "COST", "1"]))
            .contains("COST is given more than once"));
        assert!(err(tb(&["10", "1", "1s", "DRYRUN", "dryrun"]))
            .contains("DRYRUN is given more than once"));
        assert!(err(tb(&["10", "1", "1s", "SLIDING"])).starts_with("ERR unknown option 'SLIDING'"));
        assert!(err(tb(&["10", "1"])).starts_with("ERR wrong number of arguments"));
    }

    #[test]
    fn gcra_and_throttle_arguments() {
        let args: Vec<&[u8]> = vec![b"10", b"5", b"1s", b"COST", b"2"];
        let (p, o) = gcra(args.as_slice()).unwrap();
        assert_eq!(
            (p.limit, p.rate, p.period, o.cost),
            (10, 5, Millis(1000), 2)
        );
        let args: Vec<&[u8]> = vec![b"15", b"30", b"60"];
        let (p, q) = throttle(args.as_slice(), "CL.THROTTLE", Interval::RedisCell).unwrap();
        assert_eq!((p.limit, p.rate, p.period, q), (16, 30, Millis(60_000), 1));
        let args: Vec<&[u8]> = vec![b"0", b"1", b"250ms", b"0"];
        let (p, q) = throttle(args.as_slice(), "CL.THROTTLE", Interval::RedisCell).unwrap();
        assert_eq!((p.limit, p.period, q), (1, Millis(250), 0));
        let bad = |words: &[&str]| {
            let args: Vec<&[u8]> = words.iter().map(|w| w.as_bytes()).collect();
            throttle(args.as_slice(), "CL.THROTTLE", Interval::RedisCell)
                .unwrap_err()
                .0
        };
        assert!(bad(&["-1", "1", "1"]).starts_with("ERR max_burst must be"));
        assert!(bad(&["1", "0", "1"]).starts_with("ERR count_per_period must be"));
        assert!(bad(&["1", "1", "0"]).starts_with("ERR period must be"));
        assert!(bad(&["1", "1", "1", "-1"]).starts_with("ERR quantity must be"));
        assert!(bad(&["1", "1", "1", "1", "1"]).starts_with("ERR wrong number of arguments"));
        assert!(bad(&["1", "1000000001", "1"]).contains("one request per nanosecond"));
        let args: Vec<&[u8]> = vec![b"1000000000000000", b"1", b"3650d"];
        assert!(gcra(args.as_slice())
            .unwrap_err()
            .0
            .starts_with("ERR burst x period"));
    }

    /// RL.ALL's arguments (space-separated words) parsed into `out`.
    fn parse_all_into(w: &str, out: &mut AllArgs) -> Result<(), ArgError> {
        let owned: Vec<&[u8]> = w.split(' ').map(str::as_bytes).collect();
        all(owned.as_slice(), DEFAULT_MAX_LIMITERS, &|_| None, out)
    }

    #[test]
    fn all_arguments_replace_what_the_lists_held() {
        let mut out = AllArgs::default();
        parse_all_into("2 a b GCRA 5 1 1s WINDOW 5 1m", &mut out).unwrap();
        parse_all_into("1 a SLIDINGLOG 5 1h", &mut out).unwrap();
        assert_eq!((out.numkeys, out.policies.len(), out.ids.len()), (1, 1, 1));
        assert!(matches!(out.policies[0], Policy::SlidingLog { .. }));
    }

    #[test]
    fn all_arguments() {
        let parse = |w: &str| {
            let mut out = AllArgs::default();
            parse_all_into(w, &mut out).map(|()| out)
        };
        let parsed =
            parse("3 a b c TOKENBUCKET 10 1 1s window 100 1m SLIDING GCRA 5 1 1s COST 2 DRYRUN")
                .unwrap();
        assert_eq!(
            (
                parsed.numkeys,
                parsed.policies.len(),
                parsed.options.cost,
                parsed.options.dry_run
            ),
            (3, 3, 2, true)
        );
        assert!(matches!(
            parsed.policies[1],
            Policy::Window { sliding: true, .. }
        ));
        let parsed = parse("1 a SLIDINGLOG 5 1h COUNTDENIED").unwrap();
        assert!(matches!(
            parsed.policies[0],
            Policy::SlidingLog {
                count_denied: true,
                ..
            }
        ));
        let err = |w: &str| parse(w).unwrap_err().0;
        assert!(err("0 a").starts_with("ERR numkeys must be an integer from 1 to 16"));
        assert!(err("17 a").starts_with("ERR numkeys must be"));
        assert!(err("3 a b").starts_with("ERR numkeys is 3 but only 2 keys follow"));
        assert!(err("2 a b WINDOW 5 1m").starts_with("ERR limiter 2 must start with"));
        assert!(err("2 a b WINDOW 5 1m COST 1").contains("not 'COST'"));
        assert!(err("1 a WINDOW 5 1m WINDOW 5 1m").starts_with("ERR more limiters than keys"));
        assert!(err("1 a WINDOW 0 1m").starts_with("ERR limit of limiter 1 must be"));
        assert!(err("2 a b WINDOW 5 1m GCRA 5 1 0").starts_with("ERR period of limiter 2 must be"));
        assert!(
            err("1 a TOKENBUCKET 5 1").starts_with("ERR limiter 1 (TOKENBUCKET) lacks arguments")
        );
        assert!(err("1 a WINDOW 5 1m SLIDING SLIDING").starts_with("ERR unknown option 'SLIDING'"));
        assert!(err("1 a GCRA 1 2000000000 1s").contains("one request per nanosecond"));
    }

    #[test]
    fn command_flags() {
        let args: Vec<&[u8]> = vec![b"5", b"1m", b"SLIDING"];
        assert!(window(args.as_slice()).unwrap().1.flag);
        let args: Vec<&[u8]> = vec![b"5", b"1m", b"countdenied", b"COUNTDENIED"];
        assert!(sliding_log(args.as_slice()).is_err());
    }
}
