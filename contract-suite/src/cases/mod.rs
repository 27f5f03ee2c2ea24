//! The contract cases, each a plain `async fn` over a fresh, empty store.
//!
//! Time-based cases use short TTLs and real time, and never sleep less than
//! the window they wait out.

mod acquire;
mod closed;
mod fairness;
mod fencing;
mod holder;
mod keepalive;
mod observability;
mod operator;
mod release;
mod renew;
mod rwlock;
mod safety;
mod schedule;
mod semaphore;
mod validation;
mod waiting;

pub use acquire::*;
pub use closed::*;
pub use fairness::*;
pub use fencing::*;
pub use holder::*;
pub use keepalive::*;
pub use observability::*;
pub use operator::*;
pub use release::*;
pub use renew::*;
pub use rwlock::*;
pub use safety::*;
pub use schedule::*;
pub use semaphore::*;
pub use validation::*;
pub use waiting::*;
