//! The same service on smol, with no tokio runtime anywhere: the adapter's blocking
//! connections run on threads of their own and answer through futures channels.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use ruststream::exec::Smol;
use ruststream_core::Value;
use ruststream_rusqlite::prelude::*;

#[test]
fn runs_on_smol() {
    const N: u32 = 6;
    let db = Db::new("smol");
    db.schema();
    let broker = RusqliteBroker::open(&db.path).handle();
    let videos = broker.publisher::<VideoJob>();
    let exports = broker.publisher::<ExportJob>();
    let (seen_videos, seen_exports) = (Seen::default(), Seen::default());
    let service = service(&broker, |b| {
        include_both(
            b,
            Record::new(&seen_videos),
            Record::retrying(&seen_exports),
        )
    })
    .executor(Arc::new(Smol));
    let stop = async {
        for n in 0..N {
            let message = Message::json(&Video { n }).unwrap();
            videos
                .publish(
                    message
                        .clone()
                        .column("channel", Value::Int(i64::from(n % 2))),
                )
                .await
                .unwrap();
            exports.publish(message).await.unwrap();
        }
        eventually(&Smol, Duration::from_secs(20), || {
            seen_videos.len() >= N as usize && seen_exports.len() >= 2 * N as usize
        })
        .await;
    };
    smol::block_on(service.run_until(stop)).unwrap();

    assert_eq!(seen_videos.messages(), (0..N).collect::<Vec<_>>());
    let retried: Vec<(u32, i64)> = (0..N).flat_map(|n| [(n, 1), (n, 2)]).collect();
    assert_eq!(seen_exports.all(), retried);
    assert_eq!(db.count("SELECT COUNT(*) FROM video_jobs"), 0);
    assert_eq!(
        db.count("SELECT COUNT(*) FROM exports WHERE processed_at IS NOT NULL AND attempt = 2"),
        i64::from(N)
    );
    assert!(broker.adapter().is_closed());
    assert_eq!(broker.adapter().open_connections(), 0);
    let late = smol::block_on(
        videos.publish(
            Message::json(&Video { n: 1 })
                .unwrap()
                .column("channel", Value::Int(1)),
        ),
    );
    assert!(matches!(late, Err(PublishError::Closed)), "{late:?}");
    assert_eq!(db.count("SELECT COUNT(*) FROM video_jobs"), 0);
}
