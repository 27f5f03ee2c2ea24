//! Semaphores: the permit cycle next to the lock cycle, and many tasks
//! waiting for a few permits of one name. The same for every engine.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use alkstore_core::Store;
use tracing::instrument::WithSubscriber;
use tracing::span::{Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

use crate::measure::{Rounds, in_turn};
use crate::report::Row;

const TTL: Duration = Duration::from_secs(60);

/// The permits of the contended semaphore.
pub const PERMITS: u32 = 8;

/// `try_acquire_permit` + release of a free semaphore of [`PERMITS`], and
/// `try_lock` + release of a free name, alternated (A B A B …, the first
/// round a warm-up): the permit cycle against the lock cycle, whose target
/// is 1.2×, and the lock cycle against `floor`.
pub async fn cycle(
    engine: &'static str,
    store: &dyn Store,
    iterations: u32,
    floor: &Row,
) -> [Row; 2] {
    let mut rounds = Rounds::<2>::default();
    for round in 0..=crate::measure::RUNS {
        let runs = in_turn!(
            round,
            iterations,
            [{ crate::ops::one_cycle(store).await }, {
                let permit = store.try_acquire_permit("permits", PERMITS, "me", TTL);
                permit.await.unwrap().unwrap().release().await.unwrap();
            },]
        );
        rounds.record(round, runs);
    }
    let [lock, permit] = rounds.medians();
    let lock = Row::time(engine, "try_lock+release cycle (beside the permit's)", lock)
        .against(floor, None);
    let permit = Row::time(
        engine,
        format!("try_acquire_permit+release cycle ({PERMITS} permits)"),
        permit,
    )
    .against(&lock, Some(1.2));
    [lock, permit]
}

/// The last `attempts` a waiting acquire's span recorded.
struct Attempts(u64);

/// Adds up the attempts of every waiting acquire (its span's `attempts`
/// field, recorded at each attempt) as the spans close: the library's own
/// count, whatever the engine.
struct CountAttempts(Arc<AtomicU64>);

impl<S> tracing_subscriber::Layer<S> for CountAttempts
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        struct Visit(Option<u64>);
        impl tracing::field::Visit for Visit {
            fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
                if field.name() == "attempts" {
                    self.0 = Some(value);
                }
            }
            fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
        }
        let mut visit = Visit(None);
        values.record(&mut visit);
        if let (Some(attempts), Some(span)) = (visit.0, ctx.span(id)) {
            span.extensions_mut().replace(Attempts(attempts));
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(&id) {
            if let Some(Attempts(attempts)) = span.extensions().get::<Attempts>() {
                self.0.fetch_add(*attempts, Ordering::Relaxed);
            }
        }
    }
}

/// `tasks` tasks, each waiting (`acquire_permit`) for one of the
/// [`PERMITS`] permits of one name and releasing it at once, for `length`:
/// grants per second, and attempts per grant.
pub async fn contended(
    engine: &'static str,
    store: Arc<dyn Store>,
    tasks: usize,
    length: Duration,
) -> (f64, [Row; 2]) {
    let attempts = Arc::new(AtomicU64::new(0));
    let counting = tracing::Dispatch::new(
        tracing_subscriber::registry().with(CountAttempts(attempts.clone())),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let grants = Arc::new(AtomicU64::new(0));
    let name = format!("semaphore-{tasks}");
    let workers: Vec<_> = (0..tasks)
        .map(|t| {
            let (store, stop, grants, name) =
                (store.clone(), stop.clone(), grants.clone(), name.clone());
            let work = async move {
                let owner = format!("task-{t}");
                let wait = Duration::from_secs(1);
                while !stop.load(Ordering::Relaxed) {
                    let got = store.acquire_permit(&name, PERMITS, &owner, TTL, wait);
                    let Some(permit) = got.await.expect("acquire_permit") else {
                        continue;
                    };
                    grants.fetch_add(1, Ordering::Relaxed);
                    permit.release().await.expect("release");
                }
            };
            tokio::spawn(work.with_subscriber(counting.clone()))
        })
        .collect();
    let started = Instant::now();
    tokio::time::sleep(length).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    for worker in workers {
        worker.await.expect("worker");
    }
    let granted = grants.load(Ordering::Relaxed) as f64;
    let per_sec = granted / elapsed;
    let label = format!("{tasks} tasks on {PERMITS} permits");
    let rate = Row::rate(engine, format!("{label}: grants"), per_sec);
    let per_grant = Row {
        value: attempts.load(Ordering::Relaxed) as f64 / granted.max(1.0),
        unit: "",
        ..Row::rate(engine, format!("{label}: attempts per grant"), 0.0)
    };
    (per_sec, [rate, per_grant])
}

/// The semaphore rows of one engine: the cycles, then 8 and 64 tasks on
/// [`PERMITS`] permits; answers the points of its contention curve.
pub async fn run(
    engine: &'static str,
    store: Arc<dyn Store>,
    iterations: u32,
    floor: &Row,
    rows: &mut Vec<Row>,
) -> Vec<(usize, f64)> {
    eprintln!("bench: {engine} permits");
    rows.extend(cycle(engine, store.as_ref(), iterations, floor).await);
    let mut curve = Vec::new();
    for tasks in [PERMITS as usize, 64] {
        let (per_sec, figures) =
            contended(engine, store.clone(), tasks, Duration::from_secs(3)).await;
        rows.extend(figures);
        curve.push((tasks, per_sec));
    }
    curve
}
