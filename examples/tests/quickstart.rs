//! The quick start runs, processes every job, retries the flaky ones once, and never has two
//! jobs of one key in work together: on SQLite (rusqlite), and with `--url postgres://..` and
//! `--url mysql://..` on the sqlx adapter, at the test servers (`RUSTSTREAM_PG_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`; `RUSTSTREAM_MYSQL_URL`, default
//! `mysql://root@127.0.0.1:3306/test`). An unreachable server fails its test naming the URL.

use std::time::Duration;

#[path = "../quickstart.rs"]
#[allow(dead_code)]
mod quickstart;

use quickstart::{Args, Database, Summary};

fn args(url: &str, extra: &[&str]) -> Args {
    let mut all = vec!["--url".to_owned(), url.to_owned()];
    all.extend(extra.iter().map(|a| a.to_string()));
    Args::parse(all).expect("the arguments parse")
}

async fn run(url: &str, args: Args) -> Summary {
    tokio::time::timeout(Duration::from_secs(120), quickstart::run(args))
        .await
        .unwrap_or_else(|_| panic!("the quick start on {url} did not finish in two minutes"))
        .unwrap_or_else(|e| panic!("the quick start on {url}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_processes_every_job_one_per_key_at_a_time() {
    let dir = std::env::temp_dir().join(format!("ruststream-quickstart-{}", std::process::id()));
    let path = dir.join("quickstart.db");
    let url = format!("sqlite:{}", path.display());
    let args = args(
        &url,
        &[
            "--jobs",
            "300",
            "--keys",
            "10",
            "--workers",
            "4",
            "--flaky-every",
            "25",
            "--quiet",
        ],
    );
    assert_eq!(args.database, Database::Sqlite(path.clone()));
    let summary = run(&url, args).await;
    assert_eq!(summary.done, 300);
    assert_eq!(summary.retries, 12, "jobs 0, 25, .., 275 fail once");
    assert_eq!(summary.attempts, 312);
    assert_eq!(summary.max_per_key, 1);
    assert_eq!(summary.rows_left, 0, "every acknowledged row is deleted");
    let _ = std::fs::remove_dir_all(dir);
}

/// The small batch on a server: 200 jobs over 10 keys, 4 workers; jobs 0, 50, 100 and 150 fail
/// their first attempt (`--flaky-every` is 50 by default).
async fn small_batch_on(url: &str) {
    let args = args(
        url,
        &["--jobs", "200", "--keys", "10", "--workers", "4", "--quiet"],
    );
    let summary = run(url, args).await;
    assert_eq!(summary.done, 200, "all done");
    assert_eq!(summary.retries, 4, "jobs 0, 50, 100 and 150 fail once");
    assert_eq!(summary.attempts, 204, "each retry counted");
    assert_eq!(
        summary.max_per_key, 1,
        "no two jobs of one key in work together"
    );
    assert_eq!(summary.rows_left, 0, "every acknowledged row is deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_runs_on_postgres() {
    let url = std::env::var("RUSTSTREAM_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    small_batch_on(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_runs_on_mariadb() {
    let url = std::env::var("RUSTSTREAM_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
    small_batch_on(&url).await;
}

#[test]
fn quickstart_takes_server_urls_and_refuses_others() {
    assert_eq!(
        Database::from_url("postgres://postgres@db/app"),
        Ok(Database::Postgres("postgres://postgres@db/app".into()))
    );
    assert_eq!(
        Database::from_url("mysql://root@db/app"),
        Ok(Database::MySql("mysql://root@db/app".into()))
    );
    assert_eq!(
        Database::from_url("sqlite:jobs.db"),
        Ok(Database::Sqlite("jobs.db".into()))
    );
    let error = Args::parse(["--url".to_owned(), "redis://x/y".to_owned()])
        .expect_err("no Redis adapter")
        .to_string();
    assert!(error.contains("redis://x/y"), "{error}");
}

/// `--help` answers the help, naming every option; a wrong argument is refused, naming it.
#[test]
fn quickstart_answers_help_and_names_a_wrong_argument() {
    let help = Args::parse(["--help".to_owned()]).expect_err("help is not a run");
    assert_eq!(help.kind(), clap::error::ErrorKind::DisplayHelp);
    let text = help.to_string();
    for option in [
        "--url",
        "--jobs",
        "--keys",
        "--workers",
        "--flaky-every",
        "--quiet",
    ] {
        assert!(text.contains(option), "{option} in {text}");
    }
    let wrong = Args::parse(["--jobz".to_owned(), "3".to_owned()]).expect_err("no such option");
    assert!(wrong.to_string().contains("--jobz"), "{wrong}");
    let zero = Args::parse(["--workers".to_owned(), "0".to_owned()]).expect_err("no workers");
    assert!(zero.to_string().contains("--workers"), "{zero}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_names_an_unreachable_server() {
    let args = args("postgres://nobody:secret@127.0.0.1:1/none", &["--quiet"]);
    let error = quickstart::run(args)
        .await
        .expect_err("nothing listens on port 1")
        .to_string();
    assert!(
        error.contains("postgres://nobody:***@127.0.0.1:1/none"),
        "the error names the URL, its password hidden: {error}"
    );
}
