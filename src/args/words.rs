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

/// Whether `word` is `keyword` in any case. `keyword` is upper-case
/// letters only, for which setting the 0x20 bit on both sides compares
/// exactly, in fewer steps than `eq_ignore_ascii_case`'s (the hot path reads
/// a few keywords per call).
pub fn is_keyword(word: &[u8], keyword: &[u8]) -> bool {
    debug_assert!(keyword.iter().all(u8::is_ascii_uppercase));
    word.len() == keyword.len() && word.iter().zip(keyword).all(|(w, k)| w | 0x20 == k | 0x20)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keyword_matches_in_any_case_and_nothing_else() {
        assert!(is_keyword(b"window", b"WINDOW"));
        assert!(is_keyword(b"WiNdOw", b"WINDOW"));
        assert!(!is_keyword(b"WINDOWS", b"WINDOW"));
        assert!(!is_keyword(b"WINDO", b"WINDOW"));
        // Bytes one 0x20 bit away from a letter that are not its other case.
        assert!(!is_keyword(b"\x17INDOW", b"WINDOW"));
        assert!(!is_keyword(b"WINDO\xf7", b"WINDOW"));
        for byte in 0..=255u8 {
            let word = [byte];
            assert_eq!(
                is_keyword(&word, b"W"),
                byte.eq_ignore_ascii_case(&b'W'),
                "byte {byte}"
            );
        }
    }
}
