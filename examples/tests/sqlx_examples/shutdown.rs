//! Shutdown: `run` returns once the handlers have drained and the broker has shut down and
//! closed the pool it built.

use std::time::Duration;

use ruststream::RustStream;

use crate::common::*;

const EXPORTS: i64 = 5;

async fn run_returns_drained_and_closed(test: &str, service: fn(&str) -> RustStream) {
    let _serial = serial().await;
    // The spec's `sqlite:exports.db?mode=rwc`, in a temporary directory.
    let db = LiteFile::new(test);
    // The first export holds on until a moment after the stop.
    let hold = recorder().hold(|e| e.message == "exporting");
    service(&db.url())
        .shutdown_timeout(Duration::from_secs(10))
        .run_until(async {
            let rows: Vec<String> = (1..=EXPORTS)
                .map(|account| format!("({account}, CAST('{{\"account\": {account}}}' AS BLOB))"))
                .collect();
            db.exec(&format!(
                "INSERT INTO exports (account_id, payload) VALUES {}",
                rows.join(", ")
            ))
            .await;
            eventually("an export is in work", || async { recorder().held() == 1 }).await;
            assert!(
                !db.open_descriptors().is_empty(),
                "the broker's pool holds connections on the file while the service runs"
            );
            // Stop now, with the export in work; it goes on a moment later.
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                hold.release();
            });
        })
        .await
        .expect("the service runs");

    // `run` returned: the pool the broker built is closed, no connection of it is open.
    assert_eq!(
        db.open_descriptors(),
        Vec::<std::path::PathBuf>::new(),
        "no connection of the broker's pool is open on the file once run returns"
    );
    let started = recorder().messages("exporting").len() as i64;
    let finished = recorder().messages("exported").len() as i64;
    assert_eq!(started, 1, "one export was in work at the stop");
    assert_eq!(
        finished, started,
        "every export in work at the stop finished before run returned"
    );
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM exports").await,
        EXPORTS - finished,
        "each finished export settled before run returned; the rest stay queued"
    );

    // The stopped service left no key held: a new one takes the rest.
    service(&db.url())
        .run_until(async {
            eventually("the rest of the exports run", || async {
                db.scalar("SELECT COUNT(*) FROM exports").await == 0
            })
            .await;
        })
        .await
        .expect("the service runs again");
    let mut accounts: Vec<i64> = recorder()
        .messages("exported")
        .iter()
        .map(|e| e.int("report.account").expect("the account"))
        .collect();
    accounts.sort_unstable();
    assert_eq!(
        accounts,
        (1..=EXPORTS).collect::<Vec<_>>(),
        "each export ran once"
    );
    assert_eq!(db.open_descriptors(), Vec::<std::path::PathBuf>::new());
    db.remove();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_shutdown_by_macros() {
    run_returns_drained_and_closed("shutdown_macros", crate::shutdown_macros::service).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_shutdown_by_hand() {
    run_returns_drained_and_closed("shutdown_manual", crate::shutdown_manual::service).await;
}
