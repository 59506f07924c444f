//! The bench stays working: a small run on SQLite through the program's entry function, and
//! the fields of its JSON lines.

use std::time::{Duration, Instant};

use ruststream_bench::{Config, run};

fn args(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_owned).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_jobs_on_sqlite_write_json_lines_with_every_field() {
    let target = std::env::var("CARGO_TARGET_DIR")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../../target").to_owned());
    let started = Instant::now();
    for (adapter, form, file) in [
        ("rusqlite", "lease", "bench-test-rusqlite.db"),
        ("sqlx", "advisory", "bench-test-sqlx.db"),
    ] {
        let config = Config::parse(args(&format!(
            "--adapter {adapter} --url sqlite:{target}/{file} --form {form} --jobs 50 --workers 2 --keys 5 --rounds 1 --quiet"
        )))
        .expect("the arguments parse");
        let mut out = Vec::new();
        let summary = run(&config, &mut out).await.expect("the bench runs");
        assert!(summary.ratio_median.is_some_and(|r| r > 0.0));
        let text = String::from_utf8(out).expect("UTF-8");
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("each line is JSON"))
            .collect();
        assert_eq!(lines.len(), 4, "three runs and a summary: {text}");
        for (line, implementation) in lines[..3].iter().zip(["limit", "baseline", "ruststream"]) {
            assert_eq!(line["kind"], "run");
            assert_eq!(line["implementation"], implementation);
            assert_eq!(line["adapter"], adapter);
            assert_eq!(line["database"], "SQLite");
            assert_eq!(line["form"], form);
            assert_eq!(line["jobs"], 50);
            for field in [
                "jobs_per_s",
                "elapsed_s",
                "pickup_p50_ms",
                "pickup_p99_ms",
                "settle_p50_ms",
                "settle_p99_ms",
                "statements_per_job",
            ] {
                let value = line[field].as_f64();
                assert!(value.is_some_and(|v| v >= 0.0), "{field} in {line}");
            }
            assert!(line["jobs_per_s"].as_f64().is_some_and(|v| v > 0.0));
            assert!(line["peak_connections"].as_i64().is_some_and(|v| v >= 1));
            assert!(line["peak_memory_kib"].as_u64().is_some_and(|v| v > 0));
            assert!(line["date"].is_string());
        }
        let summary = &lines[3];
        assert_eq!(summary["kind"], "summary");
        for field in [
            "ruststream_jobs_per_s",
            "baseline_jobs_per_s",
            "ratio_median",
            "limit_jobs_per_s",
            "limit_ratio_median",
        ] {
            assert!(summary[field].as_f64().is_some_and(|v| v > 0.0), "{field}");
        }
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the smoke runs took {:?}",
        started.elapsed()
    );
}
