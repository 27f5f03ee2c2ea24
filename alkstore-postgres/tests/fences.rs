//! Fences in commit order on PostgreSQL, with a descheduled backend made
//! deterministic: a trigger in the test's schema sleeps inside the write of
//! owner `slow`, so its transaction stays in flight while another contender
//! runs.

mod common;

use common::{quoted_schema, until_someone_sleeps};

use std::sync::Arc;
use std::time::{Duration, Instant};

use alkstore_contract_suite::safety::history::{Interval, check};
use alkstore_contract_suite::support::assert_refused_within_wait;
use alkstore_core::{Lock, Store};
use alkstore_postgres::PgStore;

const TTL: Duration = Duration::from_secs(30);

/// Puts a trigger on the schema's lock table that sleeps `seconds` inside
/// every insert or update of a row for owner `slow`.
async fn slow_down_owner_slow(store: &PgStore, seconds: f64) {
    let s = quoted_schema(store);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE FUNCTION {s}.slow_writer() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.owner = 'slow' THEN PERFORM pg_sleep({seconds}); END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER slow_writer BEFORE INSERT OR UPDATE ON {s}.locks
             FOR EACH ROW EXECUTE FUNCTION {s}.slow_writer();"
    )))
    .execute(store.pool())
    .await
    .expect("install the slow trigger");
}

/// Removes what [`slow_down_owner_slow`] added, so the schema is alkstore's alone again.
async fn remove_slow_trigger(store: &PgStore) {
    let s = quoted_schema(store);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP FUNCTION {s}.slow_writer() CASCADE"
    )))
    .execute(store.pool())
    .await
    .expect("remove the slow trigger");
}

/// A schema whose owner `slow` writes slowly, a second independent store on
/// it, and `slow`'s first request in flight.
struct Scene {
    store: Arc<PgStore>,
    other: PgStore,
    schema: common::Schema,
}

impl Scene {
    async fn new(prefix: &str, seconds: f64) -> Option<Scene> {
        let (store, schema) = common::store(prefix).await?;
        slow_down_owner_slow(&store, seconds).await;
        let other = PgStore::connect(&schema.url, &schema.name).await.unwrap();
        Some(Scene {
            store: Arc::new(store),
            other,
            schema,
        })
    }

    /// Starts `slow`'s `try_lock` on the first store and returns once it is
    /// inside its write.
    async fn slow_in_flight(&self) -> tokio::task::JoinHandle<Option<Box<dyn Lock>>> {
        let store = self.store.clone();
        let first = tokio::spawn(async move { store.try_lock("n", "slow", TTL).await.unwrap() });
        until_someone_sleeps(&self.store).await;
        first
    }

    /// Releases `slow`'s grant once it came back; the next grant on the
    /// other store must carry the very next fence (nothing drawn between).
    async fn next_fence_follows(
        &self,
        first: tokio::task::JoinHandle<Option<Box<dyn Lock>>>,
        drew: &str,
    ) {
        let first = first.await.unwrap().expect("granted");
        let first_fence = first.fence();
        assert!(first.release().await.unwrap());
        let next = self
            .other
            .try_lock("n", "fast", TTL)
            .await
            .unwrap()
            .expect("free");
        assert_eq!(next.fence(), first_fence + 1, "{drew}");
        assert!(next.release().await.unwrap());
    }

    async fn end(self) {
        remove_slow_trigger(&self.store).await;
        self.other.close().await.unwrap();
        self.store.close().await.unwrap();
        self.schema.drop().await;
    }
}

/// Acquires, then releases at once; the interval as the checker wants it.
async fn grant_and_release(store: &dyn Store, owner: &str) -> Option<Interval> {
    let requested = Instant::now();
    let lock = store.try_lock("n", owner, TTL).await.unwrap()?;
    Some(release_now(lock, owner, requested).await)
}

async fn release_now(lock: Box<dyn Lock>, owner: &str, requested: Instant) -> Interval {
    let start = Instant::now();
    let end = Instant::now().min(lock.valid_until());
    let fence = lock.fence();
    assert!(lock.release().await.unwrap());
    Interval {
        owner: owner.into(),
        fence,
        requested,
        start,
        end,
        released: Some(Instant::now()),
    }
}

/// The interleaving the review reproduced: `slow` starts first, `fast`
/// contends while `slow`'s write is in flight and, if granted, releases at
/// once; `slow`'s grant, coming back after that release, must carry the
/// higher fence. (Before fences were drawn under a per-name lock, `slow`
/// got fence 1 after `fast` was granted 2 and released.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_contender_never_gets_a_fence_below_a_released_grant() {
    let Some((store, schema)) = common::store("slowfence").await else {
        return;
    };
    let store = Arc::new(store);
    slow_down_owner_slow(&store, 1.5).await;
    let fast = PgStore::connect(&schema.url, &schema.name).await.unwrap();
    let slow = tokio::spawn({
        let store = store.clone();
        async move {
            let requested = Instant::now();
            let lock = store.try_lock("n", "slow", TTL).await.unwrap();
            match lock {
                Some(lock) => Some(release_now(lock, "slow", requested).await),
                None => None,
            }
        }
    });
    until_someone_sleeps(&store).await;
    let mut history: Vec<Interval> = grant_and_release(&fast, "fast").await.into_iter().collect();
    history.extend(slow.await.unwrap());
    assert!(!history.is_empty(), "nobody was granted a free name");
    eprintln!(
        "granted: {:?}",
        history
            .iter()
            .map(|i| (&i.owner, i.fence))
            .collect::<Vec<_>>()
    );
    assert_eq!(check(&history), Ok(()));
    remove_slow_trigger(&store).await;
    fast.close().await.unwrap();
    store.close().await.unwrap();
    schema.drop().await;
}

/// The same owner asking again while its own first grant is still in flight
/// (committed only after the second request's snapshot) gets that grant,
/// as on SQLite, and not `Ok(None)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_owner_racing_its_own_grant_in_flight_gets_it() {
    let Some(scene) = Scene::new("sameowner", 1.0).await else {
        return;
    };
    let first = scene.slow_in_flight().await;
    let second = scene.other.try_lock("n", "slow", TTL).await.unwrap();
    let first = first.await.unwrap().expect("the first request is granted");
    let second = second.expect("the same owner gets its own grant, not Ok(None)");
    assert_eq!(second.fence(), first.fence(), "one grant, one fence");
    assert!(first.release().await.unwrap());
    drop(second);
    scene.end().await;
}

/// A contender refused because a concurrent grant was in flight writes
/// nothing and burns no fence: the next grant's fence is the next value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_racing_a_grant_in_flight_burns_no_fence() {
    let Some(scene) = Scene::new("raceref", 1.0).await else {
        return;
    };
    let other = &scene.other;
    let first = scene.slow_in_flight().await;
    let refused = other.try_lock("n", "fast", TTL).await.unwrap();
    assert!(
        refused.is_none(),
        "granted while another grant was in flight"
    );
    scene
        .next_fence_follows(first, "the refusal burned a fence")
        .await;
    scene.end().await;
}

/// A waiting acquire stuck behind a grant in flight (here a backend that
/// holds the name's grant path for 5 s) gives up when its wait runs out, not
/// when the other transaction ends, and its abandoned attempt burns no fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_behind_a_grant_in_flight_keeps_to_its_wait() {
    let Some(scene) = Scene::new("waitbound", 5.0).await else {
        return;
    };
    let first = scene.slow_in_flight().await;
    let wait = Duration::from_millis(300);
    // The slow grant commits only 5 s after it started.
    assert_refused_within_wait(
        &scene.other,
        ("n", "fast", TTL),
        wait,
        Duration::from_secs(2),
        "waited for the other transaction instead of its own wait",
    )
    .await;
    scene
        .next_fence_follows(first, "the abandoned attempt drew a fence")
        .await;
    scene.end().await;
}

/// A waiting acquire whose store has no free connection (its only one is
/// busy with a slow grant for 3 s) gives up when its wait runs out, without
/// sending anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_with_no_free_connection_keeps_to_its_wait() {
    let Some(scene) = Scene::new("waitconn", 3.0).await else {
        return;
    };
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&scene.schema.url)
        .await
        .unwrap();
    let narrow = Arc::new(PgStore::open(pool, &scene.schema.name).await.unwrap());
    let busy = narrow.clone();
    let first = tokio::spawn(async move { busy.try_lock("n", "slow", TTL).await.unwrap() });
    until_someone_sleeps(&scene.store).await;
    let wait = Duration::from_millis(300);
    assert_refused_within_wait(
        &*narrow,
        ("free", "fast", TTL),
        wait,
        Duration::from_secs(2),
        "waited for a connection past its wait",
    )
    .await;
    assert!(
        first
            .await
            .unwrap()
            .expect("granted")
            .release()
            .await
            .unwrap()
    );
    assert!(scene.store.holder("free").await.unwrap().is_none());
    narrow.close().await.unwrap();
    scene.end().await;
}

/// Grants `n` with a 50 ms lease and waits it out: an expired row.
async fn expired_row(store: &PgStore) -> u64 {
    let lock = store
        .try_lock("n", "gone", Duration::from_millis(50))
        .await
        .unwrap()
        .expect("free");
    let fence = lock.fence();
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(lock);
    fence
}

/// Holds the row of `n` locked in a transaction, as a purge or release in
/// flight would, until the returned transaction ends.
async fn hold_row(store: &PgStore) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT 1 FROM {}.locks WHERE name = 'n' FOR UPDATE",
        quoted_schema(store)
    )))
    .execute(&mut *tx)
    .await
    .unwrap();
    tx
}

/// A waiting acquire that times out behind the lock of an expired row (a
/// purge or release in flight) draws no fence: the next grant's fence is the
/// next value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_timed_out_behind_a_row_lock_draws_no_fence() {
    let Some((store, schema)) = common::store("rowwait").await else {
        return;
    };
    let before = expired_row(&store).await;
    let blocker = hold_row(&store).await;
    let got = store
        .lock("n", "fast", TTL, Duration::from_millis(300))
        .await
        .expect("running out of the wait is no error");
    assert!(got.is_none(), "took over a row another transaction holds");
    blocker.rollback().await.unwrap();
    let next = store
        .try_lock("n", "fast", TTL)
        .await
        .unwrap()
        .expect("expired");
    assert_eq!(
        next.fence(),
        before + 1,
        "the timed-out attempt drew a fence"
    );
    assert!(next.release().await.unwrap());
    store.close().await.unwrap();
    schema.drop().await;
}

/// The wait bounds the attempt's lock waits together: 0.8 s behind the
/// name's grant path, then behind an expired row's lock, a 1 s wait ends
/// after about 1 s in all (not 0.8 s + 1 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_waits_of_one_attempt_share_one_wait() {
    let Some((store, schema)) = common::store("sharedwait").await else {
        return;
    };
    expired_row(&store).await;
    let row_blocker = hold_row(&store).await;
    // Hold the name's grant path (the advisory lock the acquire function
    // takes) for 0.8 s from another session.
    let mut path = store.pool().acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(1634495334, hashtext('n'))")
        .execute(&mut *path)
        .await
        .unwrap();
    let unlock = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(800)).await;
        sqlx::query("SELECT pg_advisory_unlock(1634495334, hashtext('n'))")
            .execute(&mut *path)
            .await
            .unwrap();
    });
    assert_refused_within_wait(
        &store,
        ("n", "fast", TTL),
        Duration::from_secs(1),
        Duration::from_millis(500),
        "each lock wait got the whole wait",
    )
    .await;
    unlock.await.unwrap();
    row_blocker.rollback().await.unwrap();
    store.close().await.unwrap();
    schema.drop().await;
}

/// A zero wait on a store with no idle connection yet still sends its
/// attempt once (connecting is part of trying, not waiting).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_wait_on_a_fresh_store_still_tries_once() {
    let Some((store, schema)) = common::store("zerowait").await else {
        return;
    };
    let fresh = PgStore::connect(&schema.url, &schema.name).await.unwrap();
    let got = fresh
        .lock("free", "a", TTL, Duration::ZERO)
        .await
        .unwrap()
        .expect("a free name is granted to a zero wait");
    assert!(got.release().await.unwrap());
    fresh.close().await.unwrap();
    store.close().await.unwrap();
    schema.drop().await;
}

/// Grants of one name in two schemas of a database do not wait for each
/// other: with a grant of `job` in flight in one schema (its trigger
/// sleeps 1 s inside the write), a zero-wait `lock` of `job` in another
/// schema is granted at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_in_other_schemas_do_not_wait_for_each_other() {
    let Some((slow, slow_schema)) = common::store("slowschema").await else {
        return;
    };
    let (fast, fast_schema) = common::store("fastschema").await.unwrap();
    slow_down_owner_slow(&slow, 1.0).await;
    let slow = Arc::new(slow);
    let in_flight = {
        let slow = slow.clone();
        tokio::spawn(async move { slow.try_lock("job", "slow", TTL).await })
    };
    until_someone_sleeps(&slow).await;
    let asked = Instant::now();
    let got = fast.lock("job", "fast", TTL, Duration::ZERO).await.unwrap();
    let took = asked.elapsed();
    assert!(
        got.is_some(),
        "a zero-wait lock in another schema was refused behind a grant in flight"
    );
    assert!(took < Duration::from_millis(500), "took {took:?}");
    let granted = in_flight.await.unwrap().unwrap().expect("the slow grant");
    assert!(granted.release().await.unwrap());
    assert!(got.unwrap().release().await.unwrap());
    remove_slow_trigger(&slow).await;
    fast.close().await.unwrap();
    fast_schema.drop().await;
    slow.close().await.unwrap();
    slow_schema.drop().await;
}

/// Fence raises while grants of every kind run on other connections: no
/// raise and no grant fails, every grant that began after a raise answered
/// is above it, and each task's successive grants of its name (a lock, a
/// permit or a reader) carry rising fences. (Whether a raise
/// ever meets a grant in a deadlock here is chance: the same run passes
/// without the raise's table locks, which keep a raise that loses one from
/// having moved the sequence — a case no test here provokes.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raises_during_grants_neither_fail_nor_lower_a_fence() {
    let Some((store, schema)) = common::store("raising").await else {
        return;
    };
    let store = Arc::new(store);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let floor = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let granters: Vec<_> = (0..6)
        .map(|i| {
            let (store, stop, floor) = (store.clone(), stop.clone(), floor.clone());
            tokio::spawn(async move {
                let (name, mut last, mut grants) = (format!("n{}", i % 3), 0, 0);
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let at_least = floor.load(std::sync::atomic::Ordering::SeqCst);
                    let owner = format!("o{i}");
                    let lock = match i % 3 {
                        0 => store.try_lock(&name, &owner, TTL).await,
                        1 => store.try_acquire_permit(&name, 2, &owner, TTL).await,
                        _ => store.try_read_lock(&name, &owner, TTL).await,
                    }
                    .expect("no grant fails while fences are raised");
                    let Some(lock) = lock else { continue };
                    assert!(
                        lock.fence() >= at_least,
                        "{} below a raise's {at_least}",
                        lock.fence()
                    );
                    assert!(
                        lock.fence() > last,
                        "{name}: fence {} after {last}",
                        lock.fence()
                    );
                    last = lock.fence();
                    grants += 1;
                    lock.release().await.unwrap();
                }
                grants
            })
        })
        .collect();
    for _ in 0..20 {
        let next = store
            .raise_fences(alkstore_core::MIN_FENCE_RAISE)
            .await
            .unwrap();
        floor.fetch_max(next, std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut grants = 0;
    for granter in granters {
        grants += granter.await.unwrap();
    }
    assert!(grants > 20, "the grants ran beside the raises: {grants}");
    schema.drop().await;
}
