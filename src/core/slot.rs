//! Valkey Cluster's hash slot of a key (CRC16/XMODEM of the key, or of its
//! hash tag, modulo 16384), for RL.ALL's same-slot check.

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The part of the key that is hashed: the first `{...}` with something
/// inside, else the whole key.
fn hashed(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

pub fn key_slot(key: &[u8]) -> u16 {
    crc16(hashed(key)) & 16383
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_slots() {
        // Values from CLUSTER KEYSLOT.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"123456789"), 0x31c3 & 16383);
    }
}
