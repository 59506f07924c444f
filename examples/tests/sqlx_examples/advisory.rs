//! The advisory form: the videos of one channel go into work one at a time; an encode that fails
//! returns its row with the release of its key, its attempt counted.

use std::collections::BTreeMap;
use std::time::Duration;

use ruststream::RustStream;

use crate::common::*;

/// The videos: (channel, title).
const VIDEOS: [(&str, &str); 6] = [
    ("news", "n1"),
    ("news", "n2"),
    ("sport", "s1"),
    ("news", "n3"),
    ("sport", "s2"),
    ("music", "m1"),
];

async fn one_video_per_channel_and_retries(test: &str, service: fn(&str) -> RustStream) {
    let _serial = serial().await;
    let db = LiteFile::new(test);
    // The first retry of a video: its row came back after the failed encode.
    let hold = recorder().hold(|e| e.message == "encoding" && e.int("attempt") == Some(2));
    service(&db.url())
        .shutdown_timeout(Duration::from_secs(10))
        .run_until(async {
            let rows: Vec<String> = VIDEOS
                .iter()
                .map(|(channel, title)| {
                    format!(
                        "('{channel}', CAST('{{\"channel\": \"{channel}\", \"title\": \"{title}\"}}' AS BLOB))"
                    )
                })
                .collect();
            db.exec(&format!(
                "INSERT INTO video_jobs (channel, payload) VALUES {}",
                rows.join(", ")
            ))
            .await;
            eventually("a failed video is retried", || async {
                recorder().held() == 1
            })
            .await;
            let retried = recorder()
                .messages("encoding")
                .last()
                .and_then(|e| e.field("title").map(str::to_owned))
                .expect("the retried video's title");
            assert_eq!(
                db.scalar(&format!(
                    "SELECT attempt FROM video_jobs WHERE CAST(payload AS TEXT) LIKE '%\"{retried}\"%'"
                ))
                .await,
                2,
                "the failed encode returned the row, and each take counted its attempt"
            );
            assert!(
                recorder()
                    .messages("encode ended")
                    .iter()
                    .any(|e| e.field("title") == Some(retried.as_str())
                        && e.field("encoded") == Some("false")),
                "the first attempt failed"
            );
            hold.release();
            eventually("every video is encoded and its row deleted", || async {
                db.scalar("SELECT COUNT(*) FROM video_jobs").await == 0
            })
            .await;
        })
        .await
        .expect("the service runs");
    assert_one_per_channel_then_retried();
    db.remove();
}

/// One video per channel in work at a time, by the recorded events in the order they happened,
/// and each video encoded at its second attempt after a failed first.
fn assert_one_per_channel_then_retried() {
    let mut in_work: BTreeMap<String, usize> = BTreeMap::new();
    let mut most: BTreeMap<String, usize> = BTreeMap::new();
    let mut attempts: BTreeMap<String, Vec<(i64, bool)>> = BTreeMap::new();
    for event in recorder().events() {
        let channel = event.field("channel").unwrap_or_default().to_owned();
        match event.message.as_str() {
            "encoding" => {
                let n = in_work.entry(channel.clone()).or_default();
                *n += 1;
                let top = most.entry(channel).or_default();
                *top = (*top).max(*n);
            }
            "encode ended" => {
                *in_work.entry(channel).or_default() -= 1;
                attempts
                    .entry(event.field("title").unwrap_or_default().to_owned())
                    .or_default()
                    .push((
                        event.int("attempt").expect("the attempt"),
                        event.field("encoded") == Some("true"),
                    ));
            }
            _ => {}
        }
    }
    assert_eq!(
        most,
        BTreeMap::from([
            ("music".to_owned(), 1),
            ("news".to_owned(), 1),
            ("sport".to_owned(), 1)
        ]),
        "one video per channel in work at a time"
    );
    for (_, title) in VIDEOS {
        assert_eq!(
            attempts.get(title).map(Vec::as_slice),
            Some(&[(1, false), (2, true)][..]),
            "video {title}: the first attempt fails and is retried, the second encodes"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forms_advisory_by_macros() {
    one_video_per_channel_and_retries("advisory_macros", crate::advisory_macros::service).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forms_advisory_by_hand() {
    one_video_per_channel_and_retries("advisory_manual", crate::advisory_manual::service).await;
}
