//! One release bus per database file in this process, so that a release
//! through one `SqliteStore` wakes waiters of another store on the same file.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use alkstore_core::ReleaseBus;

static BUSES: OnceLock<Mutex<HashMap<PathBuf, Weak<ReleaseBus>>>> = OnceLock::new();

/// The bus of the file at `path` (canonical), shared while any store has it open.
pub(crate) fn for_file(path: PathBuf) -> Arc<ReleaseBus> {
    let mut buses = BUSES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    buses.retain(|_, bus| bus.strong_count() > 0);
    if let Some(bus) = buses.get(&path).and_then(Weak::upgrade) {
        return bus;
    }
    let bus = Arc::new(ReleaseBus::new());
    buses.insert(path, Arc::downgrade(&bus));
    bus
}
