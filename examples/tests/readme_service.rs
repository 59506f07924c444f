//! The README's PostgreSQL service is `examples/readme_service.rs`, byte for byte, and runs:
//! as a process against the test server (`RUSTSTREAM_PG_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`), in a schema of the test's own, it publishes a
//! signup's email in the signup's transaction, sends it once, deletes the job, and exits with
//! success on SIGTERM.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ruststream_sqlx::testing::PgSchema;

const EXAMPLE: &str = include_str!("../readme_service.rs");
const README: &str = include_str!("../../README.md");

#[test]
fn the_readme_shows_the_example_whole() {
    let section = README
        .split("## A service on PostgreSQL")
        .nth(1)
        .expect("the README has a section \"A service on PostgreSQL\"");
    // The fence may say `no_run`: the guide's doctests compile it without a server.
    let block = section
        .split("```rust")
        .nth(1)
        .and_then(|rest| rest.split_once('\n'))
        .and_then(|(_, rest)| rest.split("\n```").next())
        .expect("a ```rust block in that section");
    assert_eq!(
        format!("{block}\n"),
        EXAMPLE,
        "the README's block is examples/readme_service.rs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_service_sends_the_signup_email_once_and_stops_on_sigterm() {
    let url = std::env::var("RUSTSTREAM_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let schema = PgSchema::create(&url).await.unwrap();
    let separator = if url.contains('?') { '&' } else { '?' };
    let database_url = format!(
        "{url}{separator}options=-c%20search_path%3D{}",
        schema.name()
    );
    let mut child = Command::new(common::example("readme_service"))
        .env("DATABASE_URL", &database_url)
        .stdout(Stdio::piped())
        .spawn()
        .expect("the example starts");
    let lines = common::lines(&mut child);
    let first = lines
        .recv_timeout(Duration::from_secs(60))
        .expect("the service sends the email");
    assert_eq!(first, "sent a welcome to ada@example.com");

    // Settled: the acknowledged job is deleted; the signup is there.
    let pool = schema.pool(1).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let jobs: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM email_jobs")
            .fetch_one(&pool)
            .await
            .unwrap();
        if jobs == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the job was never deleted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let users: Vec<String> = sqlx::query_scalar("SELECT email FROM users")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(users, ["ada@example.com"]);
    pool.close().await;

    let status = common::terminate(&mut child, Duration::from_secs(30));
    assert!(status.success(), "{status}");
    let rest: Vec<String> = lines.try_iter().collect();
    assert!(rest.is_empty(), "sent once: {rest:?}");
    schema.drop().await.unwrap();
}
