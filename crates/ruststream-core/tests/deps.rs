//! The core is sans-IO: no async runtime and no database driver among its normal
//! dependencies.

use std::process::Command;

/// Packages the core must never depend on.
const FORBIDDEN: &[&str] = &[
    "tokio",
    "async-std",
    "smol",
    "sqlx",
    "tokio-postgres",
    "postgres",
    "mysql_async",
    "rusqlite",
    "libsqlite3-sys",
];

#[test]
fn core_depends_on_no_runtime_and_no_driver() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(&cargo)
        .args([
            "tree",
            "-p",
            "ruststream-core",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap_or_else(|e| panic!("running `{cargo} tree`: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "`{cargo} tree` failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Each line is `name vX.Y.Z [(path)] [(*)]`.
    let packages: Vec<&str> = stdout
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    assert_eq!(
        packages.first(),
        Some(&"ruststream-core"),
        "the tree starts at the core:\n{stdout}"
    );
    assert!(
        packages.contains(&"sha2"),
        "the tree lists the core's dependencies:\n{stdout}"
    );
    for name in FORBIDDEN {
        assert!(
            !packages.contains(name),
            "ruststream-core depends on `{name}`:\n{stdout}"
        );
    }
}
