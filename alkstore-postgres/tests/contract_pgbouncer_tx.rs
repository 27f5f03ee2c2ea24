//! The shared contract suite on the PostgreSQL engine through PgBouncer in
//! transaction mode, with PgBouncer's default settings (`cargo xtask
//! contract`'s column `postgres+pgbouncer-tx`). The stores are told
//! (`pooler=transaction`) and given no direct connection to listen on, so
//! their waiters poll: the contract holds on the pooler alone.

mod common;

use alkstore_contract_suite::{Fresh, contract_tests};
use alkstore_testkit::pgbouncer::{self, Mode};

async fn fresh() -> Option<Fresh> {
    let bouncer = pgbouncer::shared(Mode::Transaction)?;
    Some(common::fresh_at(&bouncer.url_for("postgres", "pooler=transaction")).await)
}

contract_tests!(fresh);
