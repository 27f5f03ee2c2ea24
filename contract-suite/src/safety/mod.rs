//! The safety suite: histories of many holders checked for overlap, fence
//! order and lost updates; a negative control that proves the checker can
//! fail; and a small random source for fault schedules.

pub mod broken;
pub mod history;
pub mod permits;
pub mod rw;
pub mod workload;

/// A small deterministic random source (SplitMix64), so that a failing
/// schedule can be replayed from its printed seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// A seed from the clock, printed so that a failure can be replayed.
    pub fn from_clock(what: &str) -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(7);
        eprintln!("{what}: seed {seed}");
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}
