//! The etcd figures and their floors, measured in alternation: the cycle
//! next to a raw put-if-absent + delete pair by the same channel, the
//! refusal and `holder` next to a raw range read, the renewal next to the
//! raw pair too; then release → grant across two stores (the watch).

use std::sync::Arc;

use alkstore_core::Store;
use alkstore_etcd::EtcdStore;
use alkstore_etcd::raw::Raw;

use crate::measure::{RUNS, Rounds, in_turn, percentile};
use crate::ops;
use crate::report::Row;

const ENGINE: &str = "etcd";
const ITERATIONS: u32 = 200;

pub async fn run(url: &str, collected: &mut crate::Collected) {
    let (rows, _, _, renewals) = collected.parts();
    eprintln!("bench: etcd floors and operations, alternating");
    let url = format!("{url}/bench_{}", std::process::id());
    let store = Arc::new(EtcdStore::connect(&url).await.unwrap());
    let raw = Raw::of(&store);
    let key = format!("/bench_raw_{}", std::process::id()).into_bytes();
    let held = store
        .try_lock(ops::HELD, "holder", ops::HELD_TTL)
        .await
        .unwrap()
        .unwrap();
    let mut rounds = Rounds::<6>::default();
    for round in 0..=RUNS {
        let times = in_turn!(
            round,
            ITERATIONS,
            [
                {
                    assert!(raw.put_if_absent(&key).await);
                    raw.delete(&key).await;
                },
                {
                    raw.get(&key).await;
                },
                { ops::one_cycle(store.as_ref()).await },
                { ops::one_refusal(store.as_ref()).await },
                { ops::one_renewal(held.as_ref()).await },
                { ops::one_holder(store.as_ref()).await },
            ]
        );
        rounds.record(round, times);
    }
    let m = rounds.medians();
    let pair = Row::time(ENGINE, "raw put-if-absent + delete (same channel)", m[0]);
    let read = Row::time(ENGINE, "raw range read (same channel)", m[1]);
    rows.push(pair.clone());
    rows.push(read.clone());
    rows.push(Row::time(ENGINE, "try_lock+release cycle", m[2]).against(&pair, None));
    rows.push(Row::time(ENGINE, "refused try_lock", m[3]).against(&read, None));
    rows.push(Row::time(ENGINE, "renew", m[4]).against(&pair, None));
    rows.push(Row::time(ENGINE, "holder", m[5]).against(&read, None));
    let other: Arc<dyn Store> = Arc::new(EtcdStore::connect(&url).await.unwrap());
    let store: Arc<dyn Store> = store;
    let mut samples = ops::handoffs(&store, &other, "etcd").await;
    for p in [50.0, 99.0] {
        rows.push(Row::time(
            ENGINE,
            format!("handoff to another store p{p}, the watch"),
            percentile(&mut samples, p),
        ));
    }
    held.release().await.unwrap();
    renewals.push((ENGINE, crate::held::run(ENGINE, &url, rows).await));
    let direct = EtcdStore::connect(&url).await.unwrap();
    direct.remove_store().await.unwrap();
}
