//! A custom lock: billing holds an account's key in `held_keys` while it changes the account, and a
//! payout of that account waits until billing releases the key.

use std::time::Duration;

use ruststream::RustStream;

use crate::common::*;

fn paid() -> Vec<i64> {
    let mut cents: Vec<i64> = recorder()
        .messages("paying out")
        .iter()
        .map(|e| e.int("transfer.cents").expect("the transfer's cents"))
        .collect();
    cents.sort_unstable();
    cents
}

async fn a_payout_waits_for_billing(test: &str, service: fn(&str) -> RustStream) {
    let _serial = serial().await;
    let db = LiteFile::new(test);
    // The payout of 100 holds on: its account's key is the service's then.
    let hold =
        recorder().hold(|e| e.message == "paying out" && e.int("transfer.cents") == Some(100));
    service(&db.url())
        .shutdown_timeout(Duration::from_secs(10))
        .run_until(async {
            // Billing holds account 1's key; then come payouts of accounts 2 and 1.
            db.exec(
                "BEGIN;
                 INSERT INTO held_keys (key) VALUES ('accounts-1');
                 INSERT INTO payouts (account_id, payload) VALUES
                     (2, CAST('{\"cents\": 300}' AS BLOB)),
                     (1, CAST('{\"cents\": 100}' AS BLOB)),
                     (1, CAST('{\"cents\": 200}' AS BLOB));
                 COMMIT;",
            )
            .await;
            eventually("the payout of account 2 runs", || async {
                db.scalar("SELECT COUNT(*) FROM payouts WHERE account_id = 2")
                    .await
                    == 0
            })
            .await;
            assert_eq!(paid(), [300]);
            // Several poll intervals: the payouts of account 1 wait for billing.
            tokio::time::sleep(Duration::from_millis(3500)).await;
            assert_eq!(
                paid(),
                [300],
                "no payout of account 1 runs while billing holds its key"
            );
            assert_eq!(
                db.scalar("SELECT COUNT(*) FROM payouts WHERE account_id = 1")
                    .await,
                2
            );
            assert_eq!(
                db.strings("SELECT key FROM held_keys").await,
                ["accounts-1"]
            );

            // Billing releases the key.
            db.exec("DELETE FROM held_keys WHERE key = 'accounts-1'")
                .await;
            eventually("a payout of account 1 runs", || async {
                recorder().held() == 1
            })
            .await;
            assert_eq!(
                db.strings("SELECT key FROM held_keys").await,
                ["accounts-1"],
                "the payout in work holds its account's key in held_keys"
            );
            hold.release();
            eventually("every payout runs and its row is deleted", || async {
                db.scalar("SELECT COUNT(*) FROM payouts").await == 0
            })
            .await;
        })
        .await
        .expect("the service runs");

    assert_eq!(paid(), [100, 200, 300], "each payout runs once");
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM held_keys").await,
        0,
        "the service released every key it took"
    );
    db.remove();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forms_lock_by_macros() {
    a_payout_waits_for_billing("lock_macros", crate::lock_macros::service).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forms_lock_by_hand() {
    a_payout_waits_for_billing("lock_manual", crate::lock_manual::service).await;
}
