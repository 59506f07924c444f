//! The growth and publish scenarios stay working: small runs on SQLite and PostgreSQL through
//! the scenarios' entry functions, and the fields of their JSON lines. Scaling out: a small
//! run of the program with two processes, a held key and a hot key, and the settings it
//! refuses.

use ruststream_bench::{Config, run_growth, run_publish};

fn args(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_owned).collect()
}

fn target() -> String {
    std::env::var("CARGO_TARGET_DIR")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../../target").to_owned())
}

fn pg_url() -> String {
    std::env::var("RUSTSTREAM_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

fn json_lines(out: Vec<u8>) -> Vec<serde_json::Value> {
    String::from_utf8(out)
        .expect("UTF-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn growth_claims_through_the_due_index_and_scans_without_it() {
    for url in [
        format!("sqlite:{}/bench-test-growth.db", target()),
        pg_url(),
    ] {
        let adapter = if url.starts_with("sqlite:") {
            "rusqlite"
        } else {
            "sqlx"
        };
        for index in ["due", "none"] {
            let config = Config::parse(args(&format!(
                "--scenario growth --adapter {adapter} --url {url} --rows 2000,4000 --due 50 --claims 5 --index {index} --quiet"
            )))
            .expect("the arguments parse");
            let mut out = Vec::new();
            let records = run_growth(&config, &mut out)
                .await
                .expect("the growth runs");
            let forms = if adapter == "rusqlite" { 2 } else { 3 };
            assert_eq!(records.len(), 2 * forms, "two sizes, each form");
            let lines = json_lines(out);
            assert_eq!(lines.len(), records.len());
            let sizes = [2000, 4000]
                .into_iter()
                .flat_map(|size| std::iter::repeat_n(size, forms));
            for (line, size) in lines.iter().zip(sizes) {
                assert_eq!(line["kind"], "growth");
                assert_eq!(line["rows"], size);
                assert_eq!(line["due_rows"], 50, "{line}");
                assert_eq!(line["claims"], 5);
                assert!(line["claim_p50_ms"].as_f64().is_some_and(|v| v > 0.0));
                assert!(line["claim_p99_ms"].as_f64().is_some_and(|v| v > 0.0));
                assert_eq!(
                    line["index_used"],
                    index == "due",
                    "the plan with --index {index}: {line}"
                );
                assert!(line["sql"].as_str().is_some_and(|s| s.contains("due_at")));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_writes_json_lines_and_a_summary_per_concurrency() {
    for (adapter, url) in [
        ("sqlx", format!("sqlite:{}/bench-test-publish.db", target())),
        ("tokio-postgres", pg_url()),
    ] {
        let config = Config::parse(args(&format!(
            "--scenario publish --adapter {adapter} --url {url} --jobs 100 --concurrency 1,2 --batch 10 --batch-jobs 100 --rounds 1 --quiet"
        )))
        .expect("the arguments parse");
        let mut out = Vec::new();
        let summaries = run_publish(&config, &mut out)
            .await
            .expect("the publish runs");
        assert_eq!(summaries.len(), 2);
        let lines = json_lines(out);
        // Where the publish statement wraps its insert (PostgreSQL's notification), the
        // insert alone runs too.
        let wrapped = !lines[0]["sql"]
            .as_str()
            .is_some_and(|sql| sql.starts_with("INSERT"));
        let runs = if wrapped { 6 } else { 4 };
        assert_eq!(
            lines.len(),
            2 * runs + 2,
            "runs per concurrency, two summaries"
        );
        for line in &lines[..2 * runs] {
            assert_eq!(line["kind"], "publish");
            assert_eq!(line["adapter"], adapter);
            assert_eq!(line["jobs"], 100);
            assert!(line["jobs_per_s"].as_f64().is_some_and(|v| v > 0.0));
            assert!(line["call_p50_ms"].as_f64().is_some_and(|v| v > 0.0));
            let rows = if line["mode"] == "batch" { 10 } else { 1 };
            assert_eq!(line["rows_per_insert"], rows);
        }
        let modes: Vec<(String, String)> = lines[..4]
            .iter()
            .map(|l| {
                (
                    l["implementation"].as_str().unwrap_or_default().to_owned(),
                    l["mode"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        assert_eq!(
            modes,
            [
                ("raw", "single"),
                ("ruststream", "single"),
                ("raw", "batch"),
                ("ruststream", "batch"),
            ]
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
        );
        for summary in &lines[2 * runs..] {
            assert_eq!(summary["kind"], "publish-summary");
            for field in [
                "ruststream_single_per_s",
                "raw_single_per_s",
                "ratio_median",
            ] {
                assert!(summary[field].as_f64().is_some_and(|v| v > 0.0), "{field}");
            }
            for field in [
                "raw_batch_per_s",
                "ruststream_batch_per_s",
                "batch_ratio_median",
            ] {
                assert!(summary[field].as_f64().is_some_and(|v| v > 0.0), "{field}");
            }
        }
    }
}

#[test]
fn two_processes_with_a_held_and_a_hot_key_report_each_process_and_check_the_order() {
    let line = format!(
        "--adapter sqlx --url {} --form advisory --jobs 120 --workers 2 --keys 6 --processes 2 --held-keys 1 --hot-keys 1 --hot-ms 5 --rounds 1 --quiet",
        pg_url()
    );
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ruststream-bench"))
        .args(args(&line))
        .output()
        .expect("the bench starts");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the bench failed: {stderr}");
    let lines = json_lines(output.stdout);
    assert_eq!(lines.len(), 4, "three runs and a summary: {stderr}");
    // Key 5 of 0..6 is held: its 20 rows stay, the other 100 settle.
    for (run, implementation) in lines[..3].iter().zip(["limit", "baseline", "ruststream"]) {
        assert_eq!(run["implementation"], implementation);
        assert_eq!(run["processes"], 2);
        assert_eq!(run["held_keys"], 1);
        assert_eq!(run["hot_keys"], 1);
        assert_eq!(run["hot_ms"], 5);
        assert_eq!(run["settled_jobs"], 100);
        assert_eq!(run["order_checked"], true, "{run}");
        assert!(run["jobs_per_s"].as_f64().is_some_and(|v| v > 0.0));
    }
    assert!(lines[0]["per_process_jobs"].is_null());
    assert!(lines[1]["per_process_jobs"].is_null());
    let per_process: Vec<u64> = lines[2]["per_process_jobs"]
        .as_array()
        .expect("each process's rows")
        .iter()
        .filter_map(serde_json::Value::as_u64)
        .collect();
    assert_eq!(per_process.len(), 2, "{}", lines[2]);
    assert_eq!(per_process.iter().sum::<u64>(), 100);
    assert!(lines[2]["pickup_p50_ms"].as_f64().is_some());
    assert_eq!(lines[3]["kind"], "summary");
    assert_eq!(lines[3]["processes"], 2);
    assert_eq!(lines[3]["order_checked"], true);
}

#[test]
fn scaling_settings_that_cannot_run_are_refused() {
    let sqlite = format!("sqlite:{}/bench-test-scale.db", target());
    for line in [
        format!("--adapter sqlx --url {sqlite} --form advisory --held-keys 1"),
        format!("--adapter sqlx --url {sqlite} --form advisory --processes 2"),
        format!(
            "--adapter sqlx --url {} --form lease --hot-keys 1 --hot-ms 5",
            pg_url()
        ),
        format!(
            "--adapter sqlx --url {} --form advisory --hot-keys 1",
            pg_url()
        ),
        format!(
            "--adapter sqlx --url {} --form advisory --keys 4 --held-keys 4",
            pg_url()
        ),
        format!(
            "--adapter sqlx --url {} --form advisory --keys 4 --held-keys 2 --hot-keys 3 --hot-ms 5",
            pg_url()
        ),
    ] {
        assert!(Config::parse(args(&line)).is_err(), "{line} parsed");
    }
    let config = Config::parse(args(&format!(
        "--adapter sqlx --url {} --form advisory --processes 3 --keys 5 --held-keys 1",
        pg_url()
    )))
    .expect("the arguments parse");
    assert_eq!(config.processes, 3);
    assert_eq!(config.held_keys, 1);
}
