//! The keys seen most often in a stream, in bounded memory: Space-Saving
//! (Metwally, Agrawal, El Abbadi, 2005). At most `capacity` keys are
//! tracked; a key not tracked when the table is full replaces the key with
//! the smallest count and inherits that count (+1), recorded as its error.
//!
//! Guarantees, with N the keys offered and k the capacity: a reported
//! count overestimates the key's true count by at most its `error`, and
//! `error <= N / k`; every key offered more than N / k times is reported.
//! Each offer is O(log k); memory is k keys and three words each.

use std::collections::{BTreeSet, HashMap};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hitter {
    pub key: Vec<u8>,
    /// Times offered, at most `error` more than the truth.
    pub count: u64,
    pub error: u64,
}

#[derive(Clone, Debug, Default)]
pub struct SpaceSaving {
    capacity: usize,
    slots: Vec<Hitter>,
    index: HashMap<Vec<u8>, usize>,
    /// (count, slot) of every slot: the smallest first.
    by_count: BTreeSet<(u64, usize)>,
    offered: u64,
}

impl SpaceSaving {
    pub fn new(capacity: usize) -> SpaceSaving {
        SpaceSaving {
            capacity,
            ..SpaceSaving::default()
        }
    }

    /// How many keys were offered (N).
    pub fn offered(&self) -> u64 {
        self.offered
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn offer(&mut self, key: &[u8]) {
        if self.capacity == 0 {
            return;
        }
        self.offered += 1;
        if let Some(&slot) = self.index.get(key) {
            self.bump(slot, 1);
            return;
        }
        if self.slots.len() < self.capacity {
            let slot = self.slots.len();
            self.slots.push(Hitter {
                key: key.to_vec(),
                count: 1,
                error: 0,
            });
            self.index.insert(key.to_vec(), slot);
            self.by_count.insert((1, slot));
            return;
        }
        let Some((least, slot)) = self.by_count.pop_first() else {
            return;
        };
        let evicted = std::mem::replace(
            &mut self.slots[slot],
            Hitter {
                key: key.to_vec(),
                count: least + 1,
                error: least,
            },
        );
        self.index.remove(&evicted.key);
        self.index.insert(key.to_vec(), slot);
        self.by_count.insert((least + 1, slot));
    }

    fn bump(&mut self, slot: usize, by: u64) {
        let hitter = &mut self.slots[slot];
        self.by_count.remove(&(hitter.count, slot));
        hitter.count += by;
        self.by_count.insert((hitter.count, slot));
    }

    /// The `n` keys with the highest counts, highest first (ties by key).
    pub fn top(&self, n: usize) -> Vec<&Hitter> {
        let mut all: Vec<&Hitter> = self.slots.iter().collect();
        all.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
        all.truncate(n);
        all
    }

    /// Bytes held, for the report's own accounting.
    pub fn memory(&self) -> usize {
        self.slots
            .iter()
            .map(|h| 2 * h.key.len() + std::mem::size_of::<Hitter>() + 64)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn exact_while_the_keys_fit() {
        let mut s = SpaceSaving::new(3);
        for key in ["a", "b", "a", "c", "a", "b"] {
            s.offer(key.as_bytes());
        }
        let top: Vec<(&[u8], u64, u64)> = s
            .top(3)
            .iter()
            .map(|h| (h.key.as_slice(), h.count, h.error))
            .collect();
        assert_eq!(top, vec![(&b"a"[..], 3, 0), (b"b", 2, 0), (b"c", 1, 0)]);
        assert_eq!(s.offered(), 6);
    }

    #[test]
    fn a_new_key_takes_the_smallest_slot() {
        let mut s = SpaceSaving::new(2);
        for key in ["a", "a", "b", "c"] {
            s.offer(key.as_bytes());
        }
        let top = s.top(2);
        assert_eq!((top[0].key.as_slice(), top[0].count), (&b"a"[..], 2));
        assert_eq!(
            (top[1].key.as_slice(), top[1].count, top[1].error),
            (&b"c"[..], 2, 1)
        );
    }

    #[test]
    fn zero_capacity_tracks_nothing() {
        let mut s = SpaceSaving::new(0);
        s.offer(b"a");
        assert!(s.top(10).is_empty());
    }

    proptest! {
        #![proptest_config(proptest::test_runner::Config { cases: 200, failure_persistence: None, ..Default::default() })]

        /// The published guarantees against exact counts: no count under
        /// the truth, none over it by more than its error, every error at
        /// most N / k, and every key above N / k reported.
        #[test]
        fn guarantees_hold(
            stream in proptest::collection::vec(prop_oneof![3 => 0..4u8, 1 => 0..60u8], 0..600),
            capacity in 1..12usize,
        ) {
            let mut s = SpaceSaving::new(capacity);
            let mut truth: BTreeMap<u8, u64> = BTreeMap::new();
            for key in &stream {
                s.offer(&[*key]);
                *truth.entry(*key).or_default() += 1;
            }
            let n = stream.len() as u64;
            let bound = n / capacity as u64;
            let reported = s.top(capacity);
            for h in &reported {
                let real = truth[&h.key[0]];
                prop_assert!(h.count >= real && h.count - real <= h.error);
                prop_assert!(h.error <= bound);
            }
            for (key, real) in truth {
                if real > bound {
                    prop_assert!(reported.iter().any(|h| h.key == [key]), "{} ({} > {}) missing", key, real, bound);
                }
            }
        }
    }
}
