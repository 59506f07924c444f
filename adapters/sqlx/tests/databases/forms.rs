//! Scenarios every database runs, in each form it takes: a service end to end, and a
//! publisher kept past the shutdown.

use std::time::Duration;

use ruststream::adapter::TakesRows;
use ruststream_core::spec::Described;
use ruststream_sqlx::prelude::*;

use crate::common::*;

/// Publishes `n` rows through a route's publisher into a running service, which handles each
/// once and settles its row; then the service stops, the pool the broker built is closed, and
/// the publisher, kept past the shutdown, answers `Closed` and writes no row.
pub async fn end_to_end<D, T>(db: &D, workers: usize, lease: Option<Duration>, keyed: bool)
where
    D: TestDb,
    T: InboxTable + PayloadRow + ruststream::DecodesAs<Job>,
    SqlxBroker<D::DB>: TakesRows<T>,
{
    const N: u32 = 12;
    let table = T::TABLE.table_desc().table;
    let count = format!("SELECT COUNT(*) FROM {table}");
    let key = |n: u32| keyed.then(|| (n % 3).to_string());
    let route = db.broker().route::<T>("jobs");
    assert_eq!(route.name(), "jobs");
    assert_eq!(route.table(), table);
    let publisher = route.publisher();
    let handle = route.handle().clone();

    let early = publisher.publish(message(0, key(0).as_deref())).await;
    assert!(
        matches!(early, Err(SqlxBrokerError::Closed)),
        "a publisher answers Closed before the service starts: {early:?}"
    );

    let seen = Seen::default();
    let gate = Gate::open();
    let service = RustStream::new(AppInfo::new("end-to-end", "0.1.0"))
        .shutdown_timeout(Duration::from_secs(10))
        .with_broker(route, |b| {
            b.include(builder::<T>(Record::new(&seen, &gate), workers, lease));
        });
    let stop = async {
        for n in 0..N {
            publisher
                .publish(message(n, key(n).as_deref()))
                .await
                .unwrap_or_else(|e| panic!("publish {n}: {e}"));
        }
        eventually("every message is handled", || async {
            seen.len() >= N as usize
        })
        .await;
        eventually("every row is settled", || async {
            db.scalar(&count).await == 0
        })
        .await;
    };
    service.run_until(stop).await.expect("the service runs");

    let counts = seen.counts();
    assert_eq!(
        counts.len(),
        N as usize,
        "every message handled: {counts:?}"
    );
    assert!(
        counts.values().all(|c| *c == 1),
        "each message handled once: {counts:?}"
    );
    assert!(
        seen.all().iter().all(|(_, attempt)| *attempt == Some(1)),
        "each take counted one attempt: {:?}",
        seen.all()
    );

    let broker = handle.adapter();
    assert!(broker.is_closed(), "the broker is closed after run");
    let pool = broker.pool().expect("the broker built its pool");
    assert!(pool.is_closed(), "the pool the broker built is closed");

    let late = publisher.publish(message(99, key(99).as_deref())).await;
    assert!(
        matches!(late, Err(SqlxBrokerError::Closed)),
        "a publisher kept past the shutdown answers Closed: {late:?}"
    );
    assert_eq!(db.scalar(&count).await, 0, "and writes no row");
}
