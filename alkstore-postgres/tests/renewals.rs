//! Renewals of one grant in flight together, committed by the server in
//! another order than they were sent: the handle's `valid_until` must never
//! promise more than the lease the server ends up holding.
//!
//! A statement-level trigger in the test's schema stands in for a renewal
//! descheduled before it reached its row: the first renewal sent sleeps
//! before it touches the row, the second one commits meanwhile, and the
//! first then commits last with its own, shorter ttl.

mod common;

use common::{quoted_schema, until_someone_sleeps};

use std::time::{Duration, Instant};

use alkstore_contract_suite::support::assert_not_renewed_in_time;
use alkstore_core::Store;
use alkstore_postgres::PgStore;

/// Makes the next UPDATE statement on the lock table sleep `seconds`
/// before it reads any row (a statement-level BEFORE trigger runs before
/// the scan); later statements run at once.
async fn delay_next_update(store: &PgStore, seconds: f64) {
    let s = quoted_schema(store);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SEQUENCE {s}.delay_turns;
         CREATE FUNCTION {s}.delay_once() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             -- A sequence, not a row: the second statement must not wait
             -- for the first to commit.
             IF nextval('{s}.delay_turns') = 1 THEN
                 PERFORM pg_sleep({seconds});
             END IF;
             RETURN NULL;
         END $$;
         CREATE TRIGGER delay_once BEFORE UPDATE ON {s}.locks
             FOR EACH STATEMENT EXECUTE FUNCTION {s}.delay_once();"
    )))
    .execute(store.pool())
    .await
    .expect("install the delaying trigger");
}

async fn remove_delay(store: &PgStore) {
    let s = quoted_schema(store);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP FUNCTION {s}.delay_once() CASCADE; DROP SEQUENCE {s}.delay_turns;"
    )))
    .execute(store.pool())
    .await
    .expect("remove the delaying trigger");
}

/// A short renewal sent first commits after a long one sent second: the
/// server keeps the short lease, and so must the handle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_committed_out_of_order_never_overstate_the_lease() {
    let Some((store, schema)) = common::store("reneworder").await else {
        return;
    };
    let lock = store
        .try_lock("n", "a", Duration::from_secs(10))
        .await
        .unwrap()
        .expect("free");
    delay_next_update(&store, 1.0).await;
    let short = lock.renew(Duration::from_secs(2));
    let long = async {
        until_someone_sleeps(&store).await;
        lock.renew(Duration::from_secs(60)).await
    };
    let (short, long) = tokio::join!(short, long);
    assert!(short.unwrap() && long.unwrap(), "both renewed");
    let asked = Instant::now();
    let holder = store.holder("n").await.unwrap().expect("held");
    let server_ends = asked + holder.expires_in + Duration::from_millis(50);
    assert!(
        holder.expires_in < Duration::from_secs(2),
        "the server kept the long renewal: {holder:?} (the trigger did not reorder them)"
    );
    assert!(
        lock.valid_until() <= server_ends,
        "valid_until is {:?} past the server's lease",
        lock.valid_until() - server_ends
    );
    assert!(lock.release().await.unwrap());
    remove_delay(&store).await;
    store.close().await.unwrap();
    schema.drop().await;
}

/// A keep-alive whose renewal is stuck on the server past the point where it
/// must give up says so, then releases the grant: the stuck renewal landing
/// afterwards (its backend does not notice the client left) extends nothing,
/// and the name is free at once, not one ttl later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_the_keepalive_gave_up_on_frees_the_name() {
    use alkstore_core::KeepAlive;
    let Some((store, schema)) = common::store("keepgiveup").await else {
        return;
    };
    let other = PgStore::connect(&schema.url, &schema.name).await.unwrap();
    // Renewals every 2 s, the first at 0.5 s to 2 s (spread at random);
    // given up 0.6 s before the lease ends at 6 s. The first renewal
    // sleeps 5 s and would land at 5.5 s to 7 s, after the give-up point,
    // extending the lease past 6 s.
    let ttl = Duration::from_secs(6);
    let lock = store.try_lock("n", "a", ttl).await.unwrap().expect("free");
    delay_next_update(&store, 5.0).await;
    let kept = KeepAlive::start(lock, ttl).unwrap();
    assert_not_renewed_in_time(&kept).await;
    let next = other
        .lock("n", "b", ttl, Duration::from_secs(1))
        .await
        .unwrap()
        .expect("the name was freed, not held for another ttl");
    assert!(next.release().await.unwrap());
    assert!(!kept.release().await.unwrap(), "already released");
    remove_delay(&store).await;
    other.close().await.unwrap();
    store.close().await.unwrap();
    schema.drop().await;
}

/// A renewal whose caller gave up waiting still lands on the server (its
/// backend runs the statement to the end); when it commits after a later
/// renewal, its shorter lease is the server's, and the handle must not have
/// promised the later renewal's longer one meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_given_up_on_that_lands_last_is_still_counted() {
    let Some((store, schema)) = common::store("renewdropped").await else {
        return;
    };
    let lock = store
        .try_lock("n", "a", Duration::from_secs(60))
        .await
        .unwrap()
        .expect("free");
    delay_next_update(&store, 1.5).await;
    let given_up = tokio::time::timeout(
        Duration::from_millis(100),
        lock.renew(Duration::from_secs(3)),
    );
    assert!(
        given_up.await.is_err(),
        "the delayed renewal answered in time"
    );
    until_someone_sleeps(&store).await;
    assert!(lock.renew(Duration::from_secs(60)).await.unwrap());
    assert!(
        lock.valid_until() <= Instant::now() + Duration::from_secs(3),
        "promised the long renewal while the short one was still on its way"
    );
    // Once the short renewal has landed, the server holds its lease.
    let waited = Instant::now();
    loop {
        let holder = store.holder("n").await.unwrap().expect("held");
        if holder.expires_in < Duration::from_secs(3) {
            let server_ends = Instant::now() + holder.expires_in + Duration::from_millis(50);
            assert!(
                lock.valid_until() <= server_ends,
                "valid_until is {:?} past the server's lease",
                lock.valid_until() - server_ends
            );
            break;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(5),
            "the given-up renewal never landed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(lock.release().await.unwrap());
    remove_delay(&store).await;
    store.close().await.unwrap();
    schema.drop().await;
}
