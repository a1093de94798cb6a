//! RL.ALL: one request against several limiters, all or nothing. Every key
//! is read at one time, the core decides them together
//! (`core::policy::decide_all`), and only then is anything written: one
//! effect per changed key, as for the single-limiter commands.

use std::ffi::c_int;

use super::commands::fields;
use super::ffi::{self, Ctx, Key, Slot, Str};
use super::keytype::raw_type;
use super::{controls, metrics, policy_stats, replication};
use crate::args::{self, AllArgs};
use crate::core::limiter::{Effect, Limiter};
use crate::core::policy::{self, Compound, PerLimiter, Policy};
use crate::core::slot;
use crate::core::{Millis, RetryAfter};

/// Two limiters with every option fit (RL.ALL's usual call has 11 arguments).
const INLINE_WORDS: usize = 24;

fn fail(ctx: Ctx, message: &str) -> c_int {
    metrics::record_error();
    ffi::reply_error(ctx, message)
}

/// `RL.ALL numkeys key [key ...] limiter [limiter ...] [COST n] [DRYRUN]`
pub fn all(ctx: Ctx, argv: &[Str]) -> c_int {
    // The server asks a getkeys-api command for its keys (cluster routing,
    // key prefetching). Found in testing: with the numkeys key spec alone, a
    // node that did not own the keys' slot executed the call and wrote them.
    if ffi::is_keys_position_request(ctx) {
        let count = args::parse_u64(ffi::bytes(argv[1])).unwrap_or(0);
        let count = usize::try_from(count).unwrap_or(usize::MAX);
        for position in 2..count.saturating_add(2).min(argv.len()) {
            ffi::key_at_pos(ctx, position);
        }
        return ffi::NO_REPLY;
    }
    // Each argument's bytes are asked of the server once: the parser looks
    // at most words several times. A plain array when they fit: no
    // allocation and no capacity check per word.
    let mut inline: [&[u8]; INLINE_WORDS] = [&[]; INLINE_WORDS];
    let spilled: Vec<&[u8]>;
    let words: &[&[u8]] = if argv.len() - 1 <= INLINE_WORDS {
        for (word, s) in inline.iter_mut().zip(&argv[1..]) {
            *word = ffi::bytes(*s);
        }
        &inline[..argv.len() - 1]
    } else {
        spilled = argv[1..].iter().map(|s| ffi::bytes(*s)).collect();
        &spilled
    };
    // Parsed and decided into lists that stay here: moving them would copy
    // them (a few hundred bytes each), on every call.
    let mut parsed = AllArgs::default();
    let lookup = &super::stored::lookup;
    if let Err(error) = args::all(words, controls::max_limiters(), lookup, &mut parsed) {
        return fail(ctx, &error.0);
    }
    let AllArgs {
        numkeys,
        ref policies,
        ids: ref policy_ids,
        options,
    } = parsed;
    let names = &argv[2..2 + numkeys];
    let name_bytes = &words[1..1 + numkeys];
    for (i, name) in name_bytes.iter().enumerate() {
        if name_bytes[..i].contains(name) {
            let shown = String::from_utf8_lossy(name).into_owned();
            return fail(ctx, &format!("ERR key '{shown}' is given more than once"));
        }
    }
    // Defence in depth: the server checks the slots of the keys that the
    // keys position request reports; a call over several slots must never
    // write, so the module checks too (cheap, and only in cluster mode).
    let flags = ffi::context_flags(ctx);
    if flags.cluster() {
        let slot = slot::key_slot(name_bytes[0]);
        if name_bytes.iter().any(|n| slot::key_slot(n) != slot) {
            return fail(ctx, "CROSSSLOT Keys in request don't hash to the same slot");
        }
    }
    // A peek or dry run opens every key read-only: it cannot create or touch them.
    let may_write = !options.dry_run && options.cost > 0;
    let mut keys: PerLimiter<Option<Key>> = names
        .iter()
        .map(|name| Key::open(ctx, *name, may_write))
        .collect();
    let now = ffi::now();
    let mut states: PerLimiter<Option<&Limiter>> = PerLimiter::new();
    for ((key, policy), name) in keys.iter_mut().zip(policies).zip(names) {
        let slot = match key.as_mut() {
            Some(key) => key.get::<Limiter>(raw_type()),
            None => Slot::Empty,
        };
        match slot {
            Slot::Empty => states.push(None),
            Slot::Foreign => return fail(ctx, &wrong_type(*name, None, policy)),
            Slot::Ours(limiter) if limiter.algorithm() != policy.algorithm() => {
                return fail(ctx, &wrong_type(*name, Some(limiter), policy))
            }
            Slot::Ours(limiter) => states.push(Some(&*limiter)),
        }
    }
    let mut compound = Compound::default();
    let mut effects = PerLimiter::new();
    let request = options.request();
    policy::decide_all(policies, &states, now, request, &mut compound, &mut effects);
    drop(states);
    // The limiters a LOCKOUT locked, by index: empty (no allocation) but
    // when a lock happens.
    let mut locked: Vec<usize> = Vec::new();
    if may_write {
        for (i, effect) in effects.iter().enumerate() {
            if matches!(effect, Some(Effect::Replace(Limiter::Locked(_)))) {
                locked.push(i);
            }
        }
        // Taken out in place: moving the list of effects would copy it.
        let changes = keys
            .iter_mut()
            .zip(effects.iter_mut())
            .zip(names)
            .filter_map(|((key, effect), name)| Some((key.as_mut()?, *name, effect.take()?)));
        if let Err(message) = replication::commit_all(ctx, changes) {
            return fail(ctx, message);
        }
    }
    for (outcome, name) in compound.outcomes.iter_mut().zip(names) {
        if !outcome.allowed {
            controls::on_denied(ctx, *name, !may_write);
        }
    }
    for &i in &locked {
        controls::on_locked(ctx, names[i]);
    }
    let shadow = !compound.allowed && controls::shadow();
    for (i, (id, outcome)) in policy_ids.iter().zip(&compound.outcomes).enumerate() {
        let counted = policy_stats::Counted {
            allowed: compound.allowed || shadow,
            denied: !outcome.allowed,
            shadow,
            locked: locked.contains(&i),
        };
        policy_stats::record(*id, !may_write, counted);
    }
    if shadow {
        compound.allowed = true;
        compound.retry_after = RetryAfter::After(Millis::ZERO);
        compound.granted = options.cost;
        for outcome in compound.outcomes.iter_mut() {
            *outcome = outcome.passed();
        }
    }
    metrics::record_all(compound.allowed);
    if options.brief {
        let value = match (compound.allowed, compound.retry_after) {
            (true, _) => 0,
            (false, RetryAfter::Never) => -1,
            (false, RetryAfter::After(wait)) => wait.to_i64_saturating().max(1),
        };
        return ffi::reply_integer(ctx, value);
    }
    let granted = options.partial.then_some(compound.granted as i64);
    let overall = (
        i64::from(compound.allowed),
        compound.retry_after.to_reply(),
        granted,
    );
    ffi::reply_compound(ctx, flags, overall, compound.outcomes.iter().map(fields))
}

fn wrong_type(name: Str, held: Option<&Limiter>, wanted: &Policy) -> String {
    let shown = String::from_utf8_lossy(ffi::bytes(name)).into_owned();
    match held {
        None => format!("WRONGTYPE key '{shown}' holds the wrong kind of value"),
        Some(limiter) => format!(
            "WRONGTYPE key '{shown}' holds {}, not {}",
            limiter.algorithm().description(),
            wanted.algorithm().description()
        ),
    }
}
