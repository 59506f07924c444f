//! The database files of a SQLite harness: [`SqliteFiles`].

use std::path::PathBuf;

use crate::harness::HarnessResult;

/// The directory where a SQLite harness keeps its database files: a new file per scenario and
/// process (`<table>-<pid>.db`), removed with its companions (`-wal`, `-shm`, `-journal`) once
/// the scenario passed. The file's path is the scenario's locator.
#[derive(Clone, Debug)]
pub struct SqliteFiles {
    dir: PathBuf,
}

impl SqliteFiles {
    /// The files under `std::env::temp_dir()/<name>`.
    pub fn in_temp_dir(name: &str) -> Self {
        Self::in_dir(std::env::temp_dir().join(name))
    }

    /// The files in `dir`.
    pub fn in_dir(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The path of a new database for the scenario whose table is `table`: the directory is
    /// created, and a file left there by an earlier run (with its companions) removed.
    pub fn fresh(&self, table: &str) -> HarnessResult<String> {
        std::fs::create_dir_all(&self.dir)?;
        let path = self.dir.join(format!("{table}-{}.db", std::process::id()));
        let db = path.to_string_lossy().into_owned();
        for file in files(&db) {
            match std::fs::remove_file(&file) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("cannot remove {}: {e}", file.display()).into()),
            }
        }
        Ok(db)
    }

    /// Removes the database `db` and its companions, as far as it can.
    pub fn remove(db: &str) {
        for file in files(db) {
            let _ = std::fs::remove_file(file);
        }
    }
}

/// The database file and its companions.
fn files(db: &str) -> impl Iterator<Item = PathBuf> + '_ {
    ["", "-wal", "-shm", "-journal"]
        .into_iter()
        .map(move |suffix| PathBuf::from(format!("{db}{suffix}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_removes_what_was_left() {
        let files = SqliteFiles::in_temp_dir("ruststream-conformance-files-test");
        let db = files.fresh("cf_t").expect("a fresh path");
        assert!(db.ends_with(&format!("cf_t-{}.db", std::process::id())));
        std::fs::write(&db, b"left").expect("a file");
        std::fs::write(format!("{db}-wal"), b"left").expect("a file");
        assert_eq!(files.fresh("cf_t").expect("a fresh path"), db);
        assert!(!std::path::Path::new(&db).exists());
        assert!(!std::path::Path::new(&format!("{db}-wal")).exists());
        std::fs::write(&db, b"left").expect("a file");
        SqliteFiles::remove(&db);
        assert!(!std::path::Path::new(&db).exists());
    }
}
