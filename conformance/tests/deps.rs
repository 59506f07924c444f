//! The suite depends on no adapter and no database driver: each adapter's tests hold its
//! harness and dev-depend on the suite, so no dependency circle joins them.

use std::process::Command;

/// Packages the suite must never depend on: the adapters, and the drivers they wrap.
const FORBIDDEN: &[&str] = &[
    "ruststream-sqlx",
    "ruststream-tokio-postgres",
    "ruststream-mysql-async",
    "ruststream-rusqlite",
    "sqlx",
    "sqlx-core",
    "sqlx-postgres",
    "sqlx-mysql",
    "sqlx-sqlite",
    "tokio-postgres",
    "postgres-protocol",
    "postgres-types",
    "deadpool-postgres",
    "mysql_async",
    "mysql_common",
    "rusqlite",
    "libsqlite3-sys",
];

/// The packages of `cargo tree -p ruststream-conformance` over these kinds of dependency.
fn tree(edges: &str) -> (Vec<String>, String) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(&cargo)
        .args([
            "tree",
            "-p",
            "ruststream-conformance",
            "-e",
            edges,
            "--prefix",
            "none",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap_or_else(|e| panic!("running `{cargo} tree`: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "`{cargo} tree -e {edges}` failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Each line is `name vX.Y.Z [(path)] [(*)]`.
    let packages = stdout
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    (packages, stdout)
}

#[test]
fn suite_depends_on_no_adapter_and_no_driver() {
    // Normal dependencies, and the suite's own dev- and build-dependencies: a dev-dependency
    // on an adapter would close the circle again.
    for edges in ["normal", "normal,build,dev"] {
        let (packages, stdout) = tree(edges);
        assert_eq!(
            packages.first().map(String::as_str),
            Some("ruststream-conformance"),
            "the tree starts at the suite:\n{stdout}"
        );
        for needed in ["ruststream", "ruststream-core"] {
            assert!(
                packages.iter().any(|p| p == needed),
                "the tree lists the suite's dependencies, `{needed}` among them:\n{stdout}"
            );
        }
        for name in FORBIDDEN {
            assert!(
                !packages.iter().any(|p| p == name),
                "ruststream-conformance depends on `{name}` (-e {edges}):\n{stdout}"
            );
        }
    }
}
