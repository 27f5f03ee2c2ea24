//! Timing helpers: medians of repeated runs, percentiles.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// Runs per figure; the median run is reported.
pub const RUNS: usize = 5;

/// The median over `RUNS` runs of the mean time per pass of `$body`, each
/// run `$iterations` passes long (after up to 50 warm-up passes). A macro, so
/// that the body may `.await` and borrow the caller's connection.
macro_rules! timed {
    ($iterations:expr, $body:block) => {{
        let iterations: u32 = $iterations;
        for _ in 0..iterations.min(50) $body
        let mut means = Vec::with_capacity($crate::measure::RUNS);
        for _ in 0..$crate::measure::RUNS {
            let start = std::time::Instant::now();
            for _ in 0..iterations $body
            means.push(start.elapsed() / iterations);
        }
        $crate::measure::median(&mut means)
    }};
}
pub(crate) use timed;

/// The mean time per pass of `$body` over `$iterations` passes: one run, for
/// figures measured in alternation (A B A B …) and compared by their medians.
macro_rules! once {
    ($iterations:expr, $body:block) => {{
        let iterations: u32 = $iterations;
        let start = std::time::Instant::now();
        for _ in 0..iterations $body
        start.elapsed() / iterations
    }};
}
pub(crate) use once;

/// One round of figures measured in alternation: each body run once
/// ([`once!`]) `$iterations` passes long, in the order [`order`] gives for
/// `$round`; the times in the bodies' order. The order changes from round
/// to round because a figure's time depends on what ran just before it on
/// this machine (the same statement measured 77 µs first in a round and
/// 91 µs later in it): each figure takes its turn at each place.
macro_rules! in_turn {
    ($round:expr, $iterations:expr, [$($body:block),+ $(,)?]) => {{
        let count = [$({ let _ = stringify!($body); }),+].len();
        let mut times = vec![std::time::Duration::ZERO; count];
        for turn in $crate::measure::order($round, count) {
            let mut index = 0usize;
            $(
                if index == turn {
                    times[index] = $crate::measure::once!($iterations, $body);
                }
                index += 1;
            )+
            let _ = index;
        }
        times.try_into().expect("one time per body")
    }};
}
pub(crate) use in_turn;

/// The order of `count` figures in round `round`: rotated by the round, and
/// reversed in every other round.
pub fn order(round: usize, count: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..count).collect();
    order.rotate_left(round % count.max(1));
    if round % 2 == 1 {
        order.reverse();
    }
    order
}

/// The runs of `N` figures measured in alternation, one run of each per
/// round; round 0 warms up and is not kept.
#[derive(Debug)]
pub struct Rounds<const N: usize>([Vec<Duration>; N]);

impl<const N: usize> Default for Rounds<N> {
    fn default() -> Self {
        Rounds(std::array::from_fn(|_| Vec::with_capacity(RUNS)))
    }
}

impl<const N: usize> Rounds<N> {
    pub fn record(&mut self, round: usize, runs: [Duration; N]) {
        if round > 0 {
            for (all, run) in self.0.iter_mut().zip(runs) {
                all.push(run);
            }
        }
    }

    /// Each figure's median run.
    pub fn medians(self) -> [Duration; N] {
        self.0.map(|mut runs| median(&mut runs))
    }
}

pub fn median(values: &mut [Duration]) -> Duration {
    values.sort();
    values[values.len() / 2]
}

/// The `p`-th percentile (0–100) of `values`, sorted in place.
pub fn percentile(values: &mut [Duration], p: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    values.sort();
    let rank = ((p / 100.0) * (values.len() - 1) as f64).round() as usize;
    values[rank.min(values.len() - 1)]
}

pub fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Runs `future` and answers its output with the longest single poll: how
/// long the call held the thread that polled it at a stretch (for an inline
/// engine call, the time it kept a tokio worker from other tasks).
pub async fn longest_poll<F: Future>(future: F) -> (F::Output, Duration) {
    struct Polled<F> {
        future: Pin<Box<F>>,
        longest: Duration,
    }
    impl<F: Future> Future for Polled<F> {
        type Output = (F::Output, Duration);
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let started = Instant::now();
            let polled = self.future.as_mut().poll(cx);
            self.longest = self.longest.max(started.elapsed());
            polled.map(|output| (output, self.longest))
        }
    }
    Polled {
        future: Box::pin(future),
        longest: Duration::ZERO,
    }
    .await
}
