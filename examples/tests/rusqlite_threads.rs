//! The plain-threads example runs with no async runtime: no tokio runtime is entered, and every
//! job is handled and settled.

#[path = "../rusqlite_threads.rs"]
#[allow(dead_code)]
mod threads;

#[test]
fn a_service_on_plain_threads_handles_every_job() {
    assert!(
        tokio::runtime::Handle::try_current().is_err(),
        "no tokio runtime around this test"
    );
    let dir = std::env::temp_dir().join(format!("ruststream-threads-{}", std::process::id()));
    let path = dir.join("threads.db");
    let done = threads::run(&path, 50).expect("the service runs");
    assert_eq!(done, 50);
    let left: i64 = ruststream_rusqlite::rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("SELECT COUNT(*) FROM thumbnails", [], |r| r.get(0))
        .unwrap();
    assert_eq!(left, 0, "every row settled");
    let _ = std::fs::remove_dir_all(dir);
}
