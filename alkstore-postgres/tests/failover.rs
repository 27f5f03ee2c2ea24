//! Failover against real servers: a primary with a streaming standby on
//! loopback (each test starts a pair of its own), load on 64 names, the
//! primary killed and the standby promoted, as a failover manager would.
//!
//! Asynchronous: WAL shipping is cut 1 s before the kill (a network split),
//! so the promotion loses acknowledged grants — and still every fence the
//! promoted server hands out is above every fence handed out before.
//! Synchronous: no acknowledged grant is lost.

use std::time::Duration;

use alkstore_contract_suite::failover::{
    AfterPromotion, Written, after_promotion, answers, ask_for_grants, keep, lost, warm, write,
};
use alkstore_contract_suite::support::Patience;
use alkstore_core::Store;
use alkstore_postgres::PgStore;
use alkstore_testkit::pg::{Pair, unique_schema};
use alkstore_testkit::wire::switching_proxy;
use sqlx::Connection;
use sqlx::postgres::PgConnection;

/// Waits until the standby has replayed everything the primary wrote.
async fn until_caught_up(pair: &Pair) {
    let mut primary = PgConnection::connect(&pair.primary_url).await.unwrap();
    let mut standby = PgConnection::connect(&pair.standby_url).await.unwrap();
    let (target,): (String,) = sqlx::query_as("SELECT pg_current_wal_lsn()::text")
        .fetch_one(&mut primary)
        .await
        .unwrap();
    let patience = Patience::new("the standby to catch up", Duration::from_secs(30));
    loop {
        let (behind,): (bool,) =
            sqlx::query_as("SELECT coalesce(pg_last_wal_replay_lsn() < $1::pg_lsn, true)")
                .bind(&target)
                .fetch_one(&mut standby)
                .await
                .unwrap();
        if !behind {
            return;
        }
        patience.next().await;
    }
}

/// Waits until the standby's WAL receiver is gone after [`Pair::cut`].
async fn until_cut(pair: &Pair) {
    pair.cut().unwrap();
    let mut standby = PgConnection::connect(&pair.standby_url).await.unwrap();
    let patience = Patience::new("the standby to stop receiving WAL", Duration::from_secs(30));
    loop {
        let (receiving,): (i64,) = sqlx::query_as("SELECT count(*) FROM pg_stat_wal_receiver")
            .fetch_one(&mut standby)
            .await
            .unwrap();
        if receiving == 0 {
            return;
        }
        patience.next().await;
    }
}

/// Asynchronous replication, WAL shipping cut 1 s before the primary is
/// killed: the promotion loses acknowledged grants (asynchronous
/// replication promises no more), but every fence the promoted server
/// hands out is above every fence the old primary handed out — the same
/// owner's answer for a row the promotion revived (its release or forced
/// release lost) included — and no lease of the old primary is renewed
/// there. The store reaches its server through an address moved to the
/// promoted one, as a failover manager's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_rise_across_an_asynchronous_promotion() {
    let Some(pair) = Pair::start(false) else {
        return;
    };
    let schema = unique_schema("failover");
    let (url, switch) = switching_proxy(&pair.primary_url).await;
    let store = PgStore::connect(&url, &schema).await.unwrap();
    let kept = keep(&store).await;
    let mut written = Written::default();
    write(&store, &mut written, Duration::from_millis(500)).await;
    until_caught_up(&pair).await;
    until_cut(&pair).await;
    write(&store, &mut written, Duration::from_secs(1)).await;
    pair.kill_primary().unwrap();
    pair.promote().unwrap();
    switch.point_to(&pair.standby_url);
    let AfterPromotion {
        fences_not_above: below,
        acknowledged_lost: lost,
        revived,
    } = after_promotion(&store, &written, kept)
        .await
        .report("asynchronous", &written);
    assert!(
        lost > 0,
        "the cut lost nothing: the test did not test a lossy promotion"
    );
    assert_eq!(below, 0, "fences went down across the promotion");
    revived.assert_refenced();
    store.close().await.unwrap();
}

/// Synchronous replication (`synchronous_standby_names = '*'`): load on
/// every name, then WAL shipping cut and 1 s more load — whose grants wait
/// for the standby and are never answered — then the primary killed and the
/// standby promoted. Every grant answered and still held is on the promoted
/// server, with its fence (under asynchronous replication, the grants
/// answered after the cut are lost: this test fails there), and new fences
/// are above every fence handed out before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_grants_survive_a_synchronous_promotion() {
    let Some(pair) = Pair::start(true) else {
        return;
    };
    let schema = unique_schema("syncfail");
    let (url, switch) = switching_proxy(&pair.primary_url).await;
    let store = PgStore::connect(&url, &schema).await.unwrap();
    let kept = keep(&store).await;
    let mut written = Written::default();
    write(&store, &mut written, Duration::from_millis(500)).await;
    until_cut(&pair).await;
    // Grants now wait for a standby that hears nothing: none is answered,
    // and the writer is dropped in the middle of one.
    let _ = tokio::time::timeout(
        Duration::from_secs(1),
        write(&store, &mut written, Duration::from_secs(1)),
    )
    .await;
    pair.kill_primary().unwrap();
    pair.promote().unwrap();
    switch.point_to(&pair.standby_url);
    let AfterPromotion {
        fences_not_above: below,
        acknowledged_lost: lost,
        revived,
    } = after_promotion(&store, &written, kept)
        .await
        .report("synchronous", &written);
    assert!(
        !written.held.is_empty(),
        "precondition: the writer held answered grants at the kill"
    );
    assert_eq!(
        lost, 0,
        "acknowledged grants lost under synchronous replication"
    );
    assert_eq!(below, 0, "fences went down across the promotion");
    revived.assert_refenced();
    store.close().await.unwrap();
}

/// Backends of `user` waiting for the synchronous standby (`SyncRep`) in a
/// statement of `schema`'s store, as `(pid, waiting for over a second)`.
async fn waiting_for_the_standby(
    admin: &mut PgConnection,
    user: &str,
    schema: &str,
) -> Vec<(i32, bool)> {
    sqlx::query_as(
        "SELECT pid, query_start < now() - interval '1 second' FROM pg_stat_activity
         WHERE wait_event = 'SyncRep' AND usename = $1 AND strpos(query, $2) > 0",
    )
    .bind(user)
    .bind(schema)
    .fetch_all(admin)
    .await
    .unwrap()
}

/// How many grants each store asks for while WAL shipping is cut.
const CUT_SHORT: usize = 4;

/// Synchronous replication, WAL shipping cut: a commit whose wait for the
/// standby is cut short is committed on the primary only. Cut short by
/// terminating the backend mid-wait (`pg_terminate_backend`), the server
/// answers nothing, and the store's retry on a new connection must not read
/// its own row back and answer "granted" (it did: 4 of 4 lost); it confirms
/// with a write, whose commit waits for the standby too. A role's
/// `statement_timeout` does not cut the wait short (the server disarms it
/// before the commit): those grants wait on. Then the primary is killed and
/// the standby promoted: every grant answered is on the promoted server.
/// (A cancel request, `pg_cancel_backend`, is answered as a success: a known
/// limit, docs/failover.md.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_whose_standby_wait_is_cut_short_are_not_answered() {
    let Some(pair) = Pair::start(true) else {
        return;
    };
    let mut admin = PgConnection::connect(&pair.primary_url).await.unwrap();
    sqlx::raw_sql(
        "CREATE ROLE impatient LOGIN PASSWORD 'impatient';
         ALTER ROLE impatient SET statement_timeout = '300ms';
         GRANT CREATE ON DATABASE postgres TO impatient;",
    )
    .execute(&mut admin)
    .await
    .unwrap();
    let impatient_url = format!(
        "postgres://impatient:impatient@127.0.0.1:{}/postgres",
        pair.primary.port
    );
    let (terminated_schema, timed_out_schema) = (unique_schema("term"), unique_schema("tmo"));
    let terminated = std::sync::Arc::new(
        PgStore::connect(&pair.primary_url, &terminated_schema)
            .await
            .unwrap(),
    );
    let timed_out = std::sync::Arc::new(
        PgStore::connect(&impatient_url, &timed_out_schema)
            .await
            .unwrap(),
    );
    warm(&*terminated, CUT_SHORT).await;
    warm(&*timed_out, CUT_SHORT).await;
    until_cut(&pair).await;

    let asked = ask_for_grants(&terminated, CUT_SHORT);
    // Every first try waits for the standby; each backend is terminated.
    let patience = Patience::new(
        "the grants to wait for the standby",
        Duration::from_secs(30),
    );
    // Once every first try waits for the standby (no retry exists before a
    // backend is terminated), each of those backends is terminated.
    let killed = loop {
        let waiting: Vec<i32> = waiting_for_the_standby(&mut admin, "postgres", &terminated_schema)
            .await
            .into_iter()
            .map(|(pid, _)| pid)
            .collect();
        if waiting.len() == CUT_SHORT {
            break waiting;
        }
        patience.next().await;
    };
    for pid in &killed {
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .execute(&mut admin)
            .await
            .unwrap();
    }
    let impatient = ask_for_grants(&timed_out, CUT_SHORT);
    // Settled when each ask has answered, or waits again (a retry, in a new
    // backend) or still (over a second, past the role's timeout).
    loop {
        let retries = waiting_for_the_standby(&mut admin, "postgres", &terminated_schema)
            .await
            .into_iter()
            .filter(|(pid, _)| !killed.contains(pid))
            .count();
        let patient = waiting_for_the_standby(&mut admin, "impatient", &timed_out_schema)
            .await
            .into_iter()
            .filter(|(_, long)| *long)
            .count();
        let answered =
            |asks: &[tokio::task::JoinHandle<_>]| asks.iter().filter(|a| a.is_finished()).count();
        if answered(&asked) + retries == CUT_SHORT && answered(&impatient) + patient == CUT_SHORT {
            // Not one answered: every retry waits for the standby, every
            // impatient grant waited past its role's timeout.
            assert_eq!(
                (answered(&asked), answered(&impatient)),
                (0, 0),
                "grants answered while the standby heard nothing"
            );
            break;
        }
        patience.next().await;
    }
    pair.kill_primary().unwrap();
    pair.promote().unwrap();
    let (asked, impatient) = (answers(asked).await, answers(impatient).await);
    let mut lost_names = Vec::new();
    for (schema, answered) in [
        (&terminated_schema, &asked),
        (&timed_out_schema, &impatient),
    ] {
        let promoted = PgStore::connect(&pair.standby_url, schema).await.unwrap();
        lost_names.extend(lost(&promoted, answered).await);
        promoted.close().await.unwrap();
    }
    let answered = asked.len() + impatient.len();
    eprintln!(
        "cut short: {answered} of {} grants answered, lost: {lost_names:?}",
        2 * CUT_SHORT
    );
    assert_eq!(
        lost_names,
        Vec::<String>::new(),
        "a grant answered after its standby wait was cut short was lost"
    );
}
