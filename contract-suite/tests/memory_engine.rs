//! The in-memory reference engine ([`alkstore_contract_suite::reference`])
//! on the whole suite: the wiring an engine author writes, in 13 lines.

use std::sync::Arc;

use alkstore_contract_suite::reference::MemoryEngine;
use alkstore_core::{EngineStore, Store};

// The wiring: a fresh store per case, peers on the same rows. No more than this.
async fn fresh() -> Option<alkstore_contract_suite::Fresh> {
    let engine = MemoryEngine::default();
    let store = Arc::new(EngineStore::new(engine.clone()));
    Some(
        alkstore_contract_suite::Fresh::new(store).with_peers(move || {
            let peer = EngineStore::new(engine.clone());
            std::future::ready(Arc::new(peer) as Arc<dyn Store>)
        }),
    )
}

alkstore_contract_suite::contract_tests!(fresh);
