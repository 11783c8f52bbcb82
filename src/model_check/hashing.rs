//! A fast 128-bit hash for states and memo keys. The search hashes every
//! state it reaches; std's SipHash (built for hostile input) was most of
//! its time in the test profile. Two independent multiply-rotate lanes,
//! mixed again at the end, keep collisions between distinct states out of
//! reach at the model's sizes (millions of states against 2^128).

use std::hash::{Hash, Hasher};

/// The hasher: feed it with `Hash`, read [`Fold::digest`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Fold {
    a: u64,
    b: u64,
}

const KA: u64 = 0x9e37_79b9_7f4a_7c15;
const KB: u64 = 0xc2b2_ae3d_27d4_eb4f;

impl Default for Fold {
    fn default() -> Self {
        Self {
            a: 0x243f_6a88_85a3_08d3,
            b: 0x1319_8a2e_0370_7344,
        }
    }
}

impl Fold {
    #[inline]
    fn word(&mut self, x: u64) {
        self.a = (self.a ^ x).wrapping_mul(KA).rotate_left(27);
        self.b = (self.b ^ x.rotate_left(32))
            .wrapping_mul(KB)
            .rotate_left(31);
    }

    /// Both lanes, each finished with a full avalanche.
    pub(super) fn digest(&self) -> u128 {
        (u128::from(mix(self.a ^ self.b.rotate_left(17))) << 64) | u128::from(mix(self.b ^ KA))
    }
}

/// splitmix64's finaliser.
fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Hasher for Fold {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0; 8];
            word.copy_from_slice(chunk);
            self.word(u64::from_le_bytes(word));
        }
        let mut last = [0; 8];
        let rest = chunks.remainder();
        last[..rest.len()].copy_from_slice(rest);
        self.word(u64::from_le_bytes(last) ^ ((bytes.len() as u64) << 56));
    }

    fn write_u8(&mut self, i: u8) {
        self.word(u64::from(i));
    }

    fn write_u32(&mut self, i: u32) {
        self.word(u64::from(i));
    }

    fn write_u64(&mut self, i: u64) {
        self.word(i);
    }

    fn write_usize(&mut self, i: usize) {
        self.word(i as u64);
    }

    fn write_i64(&mut self, i: i64) {
        self.word(i as u64);
    }

    fn finish(&self) -> u64 {
        self.digest() as u64
    }
}

/// For maps keyed by digests: they are hashes already, used as they are
/// rather than hashed again.
#[derive(Default, Clone, Copy)]
pub(super) struct Digested;

impl std::hash::BuildHasher for Digested {
    type Hasher = Low;
    fn build_hasher(&self) -> Low {
        Low(0)
    }
}

#[derive(Default)]
pub(super) struct Low(u64);

impl std::hash::Hasher for Low {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes.iter().take(8) {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }

    fn write_u128(&mut self, i: u128) {
        self.0 = i as u64;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The 128-bit digest of `value`.
pub(super) fn digest(value: &impl Hash) -> u128 {
    let mut fold = Fold::default();
    value.hash(&mut fold);
    fold.digest()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn near_values_do_not_collide() {
        let mut seen = HashSet::new();
        for a in 0..200u64 {
            for b in 0..200u64 {
                assert!(seen.insert(digest(&(a, b))), "({a}, {b})");
                assert!(
                    seen.insert(digest(&(format!("v{a}"), b as u8))),
                    "(v{a}, {b})"
                );
            }
        }
    }
}
