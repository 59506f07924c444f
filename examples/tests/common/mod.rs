//! What the tests that run an example as a process of its own share: the example's binary,
//! its output line by line, and SIGTERM with a bounded wait for the exit.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ExitStatus};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The binary of example `name`, which `cargo test` builds beside the tests.
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let bin = dir.join("examples").join(name);
    assert!(bin.exists(), "{} is built by cargo test", bin.display());
    bin
}

/// The child's standard output (piped), line by line, read on a thread of its own.
pub fn lines(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, lines) = mpsc::channel();
    let stdout = BufReader::new(child.stdout.take().expect("stdout is piped"));
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    lines
}

/// Sends the child SIGTERM and waits for its exit, failing the test after `within`.
pub fn terminate(child: &mut Child, within: Duration) -> ExitStatus {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "SIGTERM sent");
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("the child's status") {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "SIGTERM did not stop the example"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
