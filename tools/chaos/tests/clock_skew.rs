//! The chaos program's clock_skew scenario, run as CI runs it: the binary against the servers
//! (PostgreSQL at `RUSTSTREAM_PG_URL`, MariaDB standing in for MySQL at
//! `RUSTSTREAM_MYSQL_URL`), in the lease form on sqlx, with two services whose wall clocks
//! libfaketime sets 45 s ahead and 45 s behind the machine's. Each run must pass: no row in
//! work twice at once, every retry waiting its delay, the skew seen in effect.

use std::process::Command;

fn pg_url() -> String {
    std::env::var("RUSTSTREAM_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

fn mysql_url() -> String {
    std::env::var("RUSTSTREAM_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

#[test]
fn clock_skew_in_the_lease_form_passes_on_postgres_and_mariadb() {
    let out = Command::new(env!("CARGO_BIN_EXE_ruststream-chaos"))
        .args(["--scenario", "clock_skew", "--form", "lease"])
        .args(["--adapter", "sqlx-postgres,sqlx-mysql"])
        .args(["--jobs", "300", "--seconds", "60"])
        .args(["--pg-url", &pg_url(), "--mysql-url", &mysql_url()])
        .output()
        .expect("the chaos binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let context = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        out.status.success(),
        "ruststream-chaos exited with {}\n{context}",
        out.status
    );

    let lines: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("chaos scenario="))
        .collect();
    assert_eq!(lines.len(), 2, "one result line per run\n{context}");
    for line in &lines {
        assert!(
            line.starts_with("chaos scenario=clock_skew adapter=sqlx "),
            "{line}"
        );
        assert!(line.contains(" form=lease "), "{line}");
        assert!(line.contains(" jobs=300 "), "{line}");
        // The skew set and the skew seen: the run did not pass with the clocks right.
        assert!(line.contains(" skew=+45s,-45s "), "{line}");
        let seen: Vec<f64> = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("skew_seen="))
            .unwrap_or_else(|| panic!("no skew_seen: {line}"))
            .split(',')
            .map(|s| {
                s.trim_end_matches('s')
                    .parse::<f64>()
                    .unwrap_or_else(|e| panic!("skew_seen {s}: {e}: {line}"))
            })
            .collect();
        assert_eq!(seen.len(), 2, "{line}");
        assert!((seen[0] - 45.0).abs() < 5.0, "{line}");
        assert!((seen[1] + 45.0).abs() < 5.0, "{line}");
        assert!(line.ends_with(" verdict=ok"), "{line}");
    }
    assert!(
        lines.iter().any(|l| l.contains(" db=postgres ")),
        "a run on PostgreSQL\n{context}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains(" db=mariadb ") || l.contains(" db=mysql ")),
        "a run on MySQL/MariaDB\n{context}"
    );
    assert!(
        stdout.contains("chaos: 2 runs, 0 failed"),
        "the totals line\n{context}"
    );
}
