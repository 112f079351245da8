//! Where the broker's random numbers come from ([`crate::random_u64`]): ids, epochs, freeze
//! tokens, wait ids, jitter and the seeds of lease nonces. From the operating system, unless a seeded source was installed
//! for the process ([`seed_process`]), so that a deterministic run (a simulation, a test)
//! makes the same ids from the same seed and a failing run can be replayed exactly. (The
//! cluster simulation, `narad-sim`, needs none: the code it runs is handed every random
//! number it uses, such as a move's freeze token, in the events it is fed.)
//!
//! Secrets never come from here: password salts, session and handle keys, sealing nonces and
//! the cluster's proofs read the operating system's source directly, whatever is installed.
//! Clippy bans `getrandom::fill` elsewhere (`clippy.toml`); those places say why they may.

use std::sync::OnceLock;

use parking_lot::Mutex;

static SEEDED: OnceLock<Mutex<u64>> = OnceLock::new();

/// 64 random bits (ids, epochs, tokens, nonce seeds; never a secret).
pub(crate) fn next_u64() -> u64 {
    if let Some(state) = SEEDED.get() {
        return splitmix64(&mut state.lock());
    }
    let mut b = [0u8; 8];
    #[allow(clippy::disallowed_methods)] // (the one place the broker's ids are drawn)
    getrandom::fill(&mut b).expect("operating system random source");
    u64::from_le_bytes(b)
}

/// Makes every later [`next_u64`] of this process come from `seed` (once: `false` when a source
/// was installed already). For deterministic runs only; a server never calls it.
pub fn seed_process(seed: u64) -> bool {
    SEEDED.set(Mutex::new(seed)).is_ok()
}

/// SplitMix64 (Steele, Lea and Flood, 2014): a full-period 64-bit generator whose outputs
/// pass BigCrush, enough for ids that must only differ.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_numbers_and_they_differ() {
        let run = |seed: u64| {
            let mut s = seed;
            (0..1000).map(|_| splitmix64(&mut s)).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        let mut seen = std::collections::HashSet::new();
        assert!(
            run(7).into_iter().all(|v| seen.insert(v)),
            "a repeat in 1000"
        );
        // the first output of seed 0 (the published reference value)
        assert_eq!(run(0)[0], 0xe220_a839_7b1d_cdaf);
    }
}
