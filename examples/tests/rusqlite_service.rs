//! The rusqlite service example runs as a process of its own; SIGTERM stops it gracefully: the
//! exports in work finish and settle, the rest stay queued, and the process exits with success.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ruststream_rusqlite::rusqlite::Connection;

#[test]
fn sigterm_lets_the_exports_in_work_finish_then_exits() {
    let dir = std::env::temp_dir().join(format!("ruststream-service-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("exports.db");
    let mut child = Command::new(common::example("rusqlite_service"))
        .env("RUSTSTREAM_EXAMPLE_DB", &db)
        .env("RUSTSTREAM_EXAMPLE_JOBS", "20")
        .stdout(Stdio::piped())
        .spawn()
        .expect("the example starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut exported = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while exported < 2 {
        assert!(Instant::now() < deadline, "the service never exported");
        let line = lines.next().expect("a line").expect("text");
        if line.starts_with("exported account") {
            exported += 1;
        }
    }
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    // The rest of its output: the exports that were in work finish before it exits.
    for line in lines {
        if line.expect("text").starts_with("exported account") {
            exported += 1;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the service did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        status.success(),
        "a graceful stop exits with success: {status}"
    );
    let left: i64 = Connection::open(&db)
        .unwrap()
        .query_row("SELECT COUNT(*) FROM exports", [], |r| r.get(0))
        .unwrap();
    assert!(left > 0, "SIGTERM came before every export ran");
    assert_eq!(
        20 - left,
        exported,
        "every export that ran was settled before the exit, and no other"
    );
    let _ = std::fs::remove_dir_all(dir);
}
