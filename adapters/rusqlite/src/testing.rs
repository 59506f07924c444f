//! A throwaway SQLite file for a test: a file of its own in the system's temporary directory,
//! with the tables a test names created from their descriptions, removed (with its `-wal` and
//! `-shm` files) when dropped. See [`ruststream::testing`] for running a service on it until
//! its rows settle.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use ruststream::InboxTable;
use ruststream::core::spec::Described;
use ruststream::core::{Ddl, Dialect};

use crate::RusqliteBroker;

/// A SQLite file of its own, removed when dropped.
#[derive(Debug)]
pub struct TempDb {
    path: PathBuf,
}

impl TempDb {
    /// A new, empty file's path: `ruststream-<pid>-<n>.db` in the temporary directory.
    pub fn new() -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("ruststream-{}-{n}.db", std::process::id()));
        let db = Self { path };
        db.remove();
        db
    }

    /// Creates `T`'s table as its description writes it (`T::TABLE.ddl(..)`).
    pub fn with_table<T: InboxTable>(self) -> Result<Self, rusqlite::Error> {
        let ddl = Ddl::new(Dialect::Sqlite, T::TABLE.table_desc()).to_string();
        rusqlite::Connection::open(&self.path)?.execute_batch(&ddl)?;
        Ok(self)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A broker on the file; nothing opens until its service starts.
    pub fn broker(&self) -> RusqliteBroker {
        RusqliteBroker::open(&self.path)
    }

    /// A connection of the test's own to the file, to read what the service left.
    pub fn connect(&self) -> Result<rusqlite::Connection, rusqlite::Error> {
        rusqlite::Connection::open(&self.path)
    }

    fn remove(&self) {
        for end in ["", "-wal", "-shm"] {
            let mut file = self.path.clone().into_os_string();
            file.push(end);
            let _ = std::fs::remove_file(file);
        }
    }
}

impl Default for TempDb {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        self.remove();
    }
}
