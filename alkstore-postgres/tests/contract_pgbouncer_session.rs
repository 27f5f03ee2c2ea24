//! The shared contract suite on the PostgreSQL engine through PgBouncer in
//! session mode, with PgBouncer's default settings (`cargo xtask contract`'s
//! column `postgres+pgbouncer-session`).

mod common;

use alkstore_contract_suite::{Fresh, contract_tests};
use alkstore_testkit::pgbouncer::{self, Mode};

async fn fresh() -> Option<Fresh> {
    let bouncer = pgbouncer::shared(Mode::Session)?;
    Some(common::fresh_at(&bouncer.url_for("postgres", "pooler=session")).await)
}

contract_tests!(fresh);
