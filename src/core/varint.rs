//! LEB128 unsigned varints: 7 bits a byte, low bits first. Small numbers (the
//! gaps between log entries, costs of 1) take one byte.

pub fn push(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Reads a varint at `*pos`, advancing it. `None` on a truncated or overlong
/// encoding, so corrupt input is refused rather than misread.
pub fn read(bytes: &[u8], pos: &mut usize) -> Option<u64> {
    let mut value: u64 = 0;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*pos)?;
        *pos += 1;
        let bits = u64::from(byte & 0x7f);
        if shift == 63 && bits > 1 {
            return None;
        }
        value |= bits << shift;
        if byte & 0x80 == 0 {
            // A zero last byte (after the first) is an overlong encoding,
            // which `push` never writes.
            return (shift == 0 || bits != 0).then_some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trips(values in proptest::collection::vec(any::<u64>(), 0..50)) {
            let mut buf = Vec::new();
            for v in &values { push(&mut buf, *v); }
            let mut pos = 0;
            for v in &values { prop_assert_eq!(read(&buf, &mut pos), Some(*v)); }
            prop_assert_eq!(pos, buf.len());
        }
    }

    #[test]
    fn refuses_truncated_and_overlong() {
        let mut pos = 0;
        assert_eq!(read(&[0x80], &mut pos), None);
        let mut pos = 0;
        assert_eq!(read(&[0xff; 11], &mut pos), None);
        let mut pos = 0;
        assert_eq!(read(&[0x85, 0x00], &mut pos), None);
    }
}
