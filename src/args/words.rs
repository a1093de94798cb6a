//! The words of a command, below every parser (`args.rs`, `calendar.rs`):
//! the `Args` trait, the error type, numbers and quoting.

/// The arguments after the key, however the caller holds them.
pub trait Args {
    fn count(&self) -> usize;
    fn get(&self, index: usize) -> &[u8];
}

impl Args for [&[u8]] {
    fn count(&self) -> usize {
        self.len()
    }
    fn get(&self, index: usize) -> &[u8] {
        self[index]
    }
}

/// An error reply, built only when there is an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgError(pub String);

pub fn parse_u64(text: &[u8]) -> Option<u64> {
    if text.is_empty() {
        return None;
    }
    text.iter().try_fold(0u64, |acc, &byte| {
        let digit = byte.checked_sub(b'0').filter(|d| *d <= 9)?;
        acc.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// Shown back in an error: printable, and short.
pub(super) fn quoted(text: &[u8]) -> String {
    let shown: String = text
        .iter()
        .take(40)
        .map(|&b| if b.is_ascii_graphic() { b as char } else { '?' })
        .collect();
    shown
}
