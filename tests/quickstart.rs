//! The quick start runs, processes every job, retries the flaky ones once, and never has two
//! jobs of one key in work together.

#[path = "../examples/quickstart.rs"]
#[allow(dead_code)]
mod quickstart;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_processes_every_job_one_per_key_at_a_time() {
    let dir = std::env::temp_dir().join(format!("ruststream-quickstart-{}", std::process::id()));
    let path = dir.join("quickstart.db");
    let args = quickstart::Args::parse([
        "--url".to_owned(),
        format!("sqlite:{}", path.display()),
        "--jobs".to_owned(),
        "300".to_owned(),
        "--keys".to_owned(),
        "10".to_owned(),
        "--workers".to_owned(),
        "4".to_owned(),
        "--flaky-every".to_owned(),
        "25".to_owned(),
        "--quiet".to_owned(),
    ])
    .expect("the arguments parse");
    let summary = quickstart::run(args).await.expect("the quick start runs");
    assert_eq!(summary.done, 300);
    assert_eq!(summary.retries, 12, "jobs 0, 25, .., 275 fail once");
    assert_eq!(summary.attempts, 312);
    assert_eq!(summary.max_per_key, 1);
    assert_eq!(summary.rows_left, 0, "every acknowledged row is deleted");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn quickstart_refuses_a_server_url_it_cannot_serve_yet() {
    let error = quickstart::Args::parse(["--url".to_owned(), "postgres://x/y".to_owned()])
        .expect_err("no PostgreSQL adapter yet");
    assert!(error.contains("postgres://x/y"), "{error}");
}
