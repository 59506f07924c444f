//! What a start refuses: a subscription's table that does not exist.

use std::time::Duration;

use ruststream::adapter::TakesRows;
use ruststream::{RunError, StartError};
use ruststream_core::CheckError;

use super::{body, run};
use crate::harness::{Harness, Runs};
use crate::rows::{Rows, SuiteRow};
use crate::support::{Cx, Opts, Recorder, subscription};
use crate::{Form, TestName, Verdict};

const SHUTDOWN: Duration = Duration::from_secs(10);

/// A subscription whose table does not exist fails the start, naming the table, and the
/// service never runs its handler.
pub async fn missing_table_fails_the_start<R: Rows, H: Runs<R::MissingTableFailsTheStart>>(
    harness: &H,
    form: Form,
    test: &TestName,
) -> Verdict {
    body!(Missing => missing_in);
    run::<H, R::MissingTableFailsTheStart, _>(harness, form, test, Missing).await
}

async fn missing_in<H: Harness, T: SuiteRow>(cx: &Cx<'_, H>)
where
    H::Adapter: TakesRows<T>,
{
    cx.execute(&format!("DROP TABLE {}", cx.table.name)).await;
    let recorder = Recorder::acking();
    let broker = cx.broker();
    let service = cx.service(
        &broker,
        subscription::<T>(&recorder, Opts::default()),
        SHUTDOWN,
    );
    let refused = service
        .run_until(async {})
        .await
        .expect_err("a missing table stops the start");
    match &refused {
        RunError::Start(StartError::Check(CheckError::MissingTable { table })) => {
            assert_eq!(*table, cx.table.name, "{cx}: the refusal names the table");
        }
        other => panic!("{cx}: a missing table, not: {other}"),
    }
    let text = refused.to_string();
    assert!(
        text.contains(cx.table.name),
        "{cx}: the message names the table: {text}"
    );
    println!("{cx}: refused at start: {text}");
    assert_eq!(recorder.count(), 0, "{cx}: no handler ran");
}
