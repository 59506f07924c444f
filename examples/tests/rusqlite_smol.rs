//! The smol example runs with no tokio runtime, and every email is sent and settled.

#[path = "../rusqlite_smol.rs"]
#[allow(dead_code)]
mod mailer;

#[test]
fn a_service_on_smol_sends_every_email() {
    assert!(
        tokio::runtime::Handle::try_current().is_err(),
        "no tokio runtime here"
    );
    let dir = std::env::temp_dir().join(format!("ruststream-smol-{}", std::process::id()));
    let path = dir.join("emails.db");
    assert_eq!(mailer::run(&path, 40).expect("the service runs"), 40);
    let left: i64 = ruststream_rusqlite::rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("SELECT COUNT(*) FROM emails", [], |r| r.get(0))
        .unwrap();
    assert_eq!(left, 0, "every row settled");
    let _ = std::fs::remove_dir_all(dir);
}
