//! Services on tokio over the real server at `RUSTSTREAM_MYSQL_URL`: each form end to end,
//! the custom lock, a connection per message in the row lock form, a key held elsewhere, a
//! connection killed mid-delivery, and the shutdown.

mod common;

use std::time::Duration;

use common::*;
use mysql_async::prelude::Queryable;
use ruststream::IntoSubscription;
use ruststream_mysql_async::prelude::*;
use ruststream_mysql_async::{MySqlAsyncBrokerError, mysql_async};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_lock_form_end_to_end() {
    const N: u32 = 6;
    let db = TestDb::new("row_lock", &[JOBS]).await;
    let route = MySqlAsyncBroker::from_url(&db.url).route::<Job>("jobs");
    let handle = route.handle().clone();
    let jobs = route.publisher();
    let early = jobs.publish(video(99)).await;
    assert!(
        matches!(early, Err(MySqlAsyncBrokerError::Closed)),
        "a publisher answers Closed before the service starts: {early:?}"
    );

    let seen = Seen::default();
    let service = service(route, |b| {
        b.include(
            // One worker, so the attempts are exact: with several, a claim may count a row's
            // attempt in the moment between another claim's count and its lock, and the row
            // comes with an attempt past 1 on its first delivery (the core's row lock claim
            // commits the count before it locks the row).
            subscriber("jobs", Record::retrying(&seen))
                .map_source(|_| InboxQueue::<Job>::new("jobs"))
                .poll_interval(POLL)
                .build(),
        );
    });
    let stop = async {
        for n in 0..N {
            jobs.publish(video(n)).await.unwrap();
        }
        eventually(WAIT, || seen.len() >= 2 * N as usize).await;
    };
    service.run_until(stop).await.unwrap();

    let expected: Vec<(u32, i64)> = (0..N).flat_map(|n| [(n, 1), (n, 2)]).collect();
    assert_eq!(
        seen.all(),
        expected,
        "each message twice: attempt 1, then 2"
    );
    assert_eq!(
        db.count("SELECT COUNT(*) FROM jobs").await,
        0,
        "acknowledged rows are deleted"
    );
    let broker = handle.adapter();
    assert_eq!(broker.dialect(), Some(ruststream::core::Dialect::MariaDb));
    assert!(broker.is_closed() && broker.owns_pool());
    assert_eq!(broker.connections_held(), 0);
    // The pool sent each connection's COM_QUIT before run returned; the server ends the
    // sessions a moment later.
    assert!(
        eventually_async(Duration::from_secs(5), || db.sessions_are(0)).await,
        "no connection of the pool it built is left on the server"
    );

    let late = jobs.publish(video(100)).await;
    assert!(
        matches!(late, Err(MySqlAsyncBrokerError::Closed)),
        "{late:?}"
    );
    assert_eq!(
        db.count("SELECT COUNT(*) FROM jobs").await,
        0,
        "no row written past the shutdown"
    );
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_form_end_to_end_on_the_services_own_pool() {
    const N: u32 = 6;
    let db = TestDb::new("lease", &[EXPORTS]).await;
    // The service's own pool, without `client_found_rows`: the fenced updates still count
    // the rows they found.
    let pool = mysql_async::Pool::new(db.plain_opts());
    let broker = MySqlAsyncBroker::new(pool.clone()).handle();
    let exports = ruststream_mysql_async::MySqlAsyncPublisher::<Export>::new(&broker);
    let seen = Seen::default();
    let service = service(broker.clone(), |b| {
        b.include(
            subscriber("exports", Record::retrying(&seen))
                .map_source(|_| InboxQueue::<Export>::new("exports"))
                .workers(nonzero!(3))
                .poll_interval(POLL)
                .build(),
        );
    });
    let stop = async {
        for n in 0..N {
            exports.publish(video(n)).await.unwrap();
        }
        eventually(WAIT, || seen.len() >= 2 * N as usize).await;
    };
    service.run_until(stop).await.unwrap();

    let expected: Vec<(u32, i64)> = (0..N).flat_map(|n| [(n, 1), (n, 2)]).collect();
    assert_eq!(seen.all(), expected);
    assert_eq!(
        db.count(
            "SELECT COUNT(*) FROM exports \
             WHERE processed_at IS NOT NULL AND locked_until IS NULL AND attempt = 2"
        )
        .await,
        i64::from(N),
        "each row is marked processed after its second take, its lease cleared"
    );
    assert!(broker.adapter().is_closed() && !broker.adapter().owns_pool());
    // The service's own pool stays open.
    let mut conn = pool
        .get_conn()
        .await
        .expect("the service's pool stays open");
    let one: Option<i64> = conn.query_first("SELECT 1").await.unwrap();
    assert_eq!(one, Some(1));
    drop(conn);
    pool.disconnect().await.unwrap();
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_form_end_to_end() {
    const N: u32 = 9;
    let db = TestDb::new("advisory", &[VIDEO_JOBS]).await;
    let route = MySqlAsyncBroker::from_url(&db.url).route::<VideoJob>("videos");
    let videos = route.publisher();
    let seen = Seen::default();
    let service = service(route, |b| {
        b.include(
            subscriber("videos", Record::retrying(&seen))
                .map_source(|_| InboxQueue::<VideoJob>::new("videos"))
                .workers(nonzero!(3))
                .poll_interval(POLL)
                .build(),
        );
    });
    let stop = async {
        for n in 0..N {
            let channel = format!("c{}", n % 3);
            videos
                .publish(video(n).column("channel", channel))
                .await
                .unwrap();
        }
        eventually(WAIT, || seen.len() >= 2 * N as usize).await;
    };
    service.run_until(stop).await.unwrap();

    let expected: Vec<(u32, i64)> = (0..N).flat_map(|n| [(n, 1), (n, 2)]).collect();
    assert_eq!(seen.all(), expected);
    assert_eq!(db.count("SELECT COUNT(*) FROM video_jobs").await, 0);
    for channel in ["c0", "c1", "c2"] {
        assert_eq!(
            db.holder(&format!("video_jobs-{channel}")).await,
            None,
            "no session holds the key of {channel}"
        );
    }
    db.cleanup().await;
}

/// Records the accounts paid, and whether billing's table held the key while each ran.
#[derive(Clone)]
struct Pay {
    url: String,
    paid: std::sync::Arc<std::sync::Mutex<Vec<(u32, bool)>>>,
}

impl Handle<Video> for Pay {
    async fn handle(
        &self,
        video: &Video,
        _outs: &(),
        _ctx: &mut Context<'_>,
    ) -> Result<(), HandlerOutcome> {
        let mut conn = connect_to(&self.url).await;
        let held: Option<i64> = conn
            .exec_first(
                "SELECT COUNT(*) FROM held_keys WHERE k = ?",
                (format!("accounts-{}", video.n),),
            )
            .await
            .unwrap();
        conn.disconnect().await.unwrap();
        self.paid.lock().unwrap().push((video.n, held == Some(1)));
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_billing_holds_keeps_its_payout_waiting() {
    let db = TestDb::new("custom_lock", &[PAYOUTS, HELD_KEYS]).await;
    // Billing holds account 7's key.
    db.exec("INSERT INTO held_keys (k) VALUES ('accounts-7')")
        .await;
    let route = MySqlAsyncBroker::from_url(&db.url).route::<Payout>("payouts");
    let payouts = route.publisher();
    let pay = Pay {
        url: db.url.clone(),
        paid: Default::default(),
    };
    let paid = pay.paid.clone();
    let service = service(route, |b| {
        b.include(
            subscriber("payouts", pay)
                .map_source(|_| InboxQueue::<Payout>::new("payouts"))
                .poll_interval(POLL)
                .build(),
        );
    });
    let accounts = || {
        paid.lock()
            .unwrap()
            .iter()
            .map(|(a, _)| *a)
            .collect::<Vec<_>>()
    };
    let stop = async {
        for account in [8, 7] {
            payouts
                .publish(video(account).column("account_id", i64::from(account)))
                .await
                .unwrap();
        }
        assert!(
            eventually(WAIT, || accounts() == [8]).await,
            "account 8's payout runs"
        );
        tokio::time::sleep(POLL * 20).await;
        assert_eq!(accounts(), [8], "account 7's payout waits for billing");
        assert_eq!(
            db.count("SELECT COUNT(*) FROM payouts WHERE account_id = 7")
                .await,
            1
        );
        db.exec("DELETE FROM held_keys WHERE k = 'accounts-7'")
            .await;
        assert!(
            eventually(WAIT, || accounts() == [8, 7]).await,
            "account 7's payout runs once billing released its key"
        );
        eventually_async(WAIT, || db.count_is("SELECT COUNT(*) FROM held_keys", 0)).await;
    };
    service.run_until(stop).await.unwrap();

    assert_eq!(
        *paid.lock().unwrap(),
        [(8, true), (7, true)],
        "each payout ran while the custom lock held its key in held_keys"
    );
    assert_eq!(db.count("SELECT COUNT(*) FROM payouts").await, 0);
    assert_eq!(
        db.count("SELECT COUNT(*) FROM held_keys").await,
        0,
        "the custom unlock released every key"
    );
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_row_lock_form_holds_one_connection_per_message() {
    const WORKERS: usize = 4;
    let db = TestDb::new("per_message", &[JOBS]).await;
    let route = MySqlAsyncBroker::from_url(&db.url).route::<Job>("jobs");
    let handle = route.handle().clone();
    let jobs = route.publisher();
    let block = Block::new();
    let service = service(route, |b| {
        b.include(
            subscriber("jobs", block.clone())
                .map_source(|_| InboxQueue::<Job>::new("jobs"))
                .workers(nonzero!(WORKERS))
                .poll_interval(POLL)
                .build(),
        );
    });
    let stop = async {
        for n in 0..6 {
            jobs.publish(video(n)).await.unwrap();
        }
        assert!(
            eventually(WAIT, || block.started() >= WORKERS).await,
            "four handlers start"
        );
        tokio::time::sleep(POLL * 10).await;
        assert_eq!(
            block.started(),
            WORKERS,
            "no fifth message while four are in work"
        );
        let broker = handle.adapter();
        assert_eq!(broker.connections_held(), WORKERS, "one connection each");
        let pool = broker.pool().expect("the pool it built");
        let metrics = pool.metrics();
        let in_use = metrics
            .connections_in_use
            .load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(in_use, WORKERS, "the pool lends one connection per message");
        let open = metrics
            .connection_count
            .load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            db.sessions().await,
            open as i64,
            "the server sees every connection of the pool, and no other in its database"
        );
        // Each message's connection holds its row's transaction.
        let mut conn = connect().await;
        let holders: Vec<i64> = conn
            .exec(
                "SELECT DISTINCT t.trx_mysql_thread_id FROM information_schema.innodb_trx t \
                 JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id \
                 WHERE p.db = ?",
                (db.name.as_str(),),
            )
            .await
            .unwrap();
        conn.disconnect().await.unwrap();
        assert_eq!(
            holders.len(),
            WORKERS,
            "four sessions each hold a message's transaction: {holders:?}"
        );
        block.open();
        eventually_async(WAIT, || db.count_is("SELECT COUNT(*) FROM jobs", 0)).await;
    };
    service.run_until(stop).await.unwrap();
    assert_eq!(block.seen.messages(), (0..6).collect::<Vec<_>>());
    assert_eq!(db.count("SELECT COUNT(*) FROM jobs").await, 0);
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_held_by_another_session_is_passed_over() {
    let db = TestDb::new("held_key", &[VIDEO_JOBS]).await;
    // Another process holds channel 7's key.
    let mut other = db.conn().await;
    let name = db.lock_name("video_jobs-7");
    let locked: Option<i64> = other
        .exec_first("SELECT GET_LOCK(?, 0)", (name.as_str(),))
        .await
        .unwrap();
    assert_eq!(locked, Some(1));

    let route = MySqlAsyncBroker::from_url(&db.url).route::<VideoJob>("videos");
    let videos = route.publisher();
    let seen = Seen::default();
    let service = service(route, |b| {
        b.include(
            subscriber("videos", Record::new(&seen))
                .map_source(|_| InboxQueue::<VideoJob>::new("videos"))
                .workers(nonzero!(2))
                .poll_interval(POLL)
                .build(),
        );
    });
    let stop = async {
        // Channel 7's row comes first in claim order.
        videos
            .publish(video(7).column("channel", "7"))
            .await
            .unwrap();
        videos
            .publish(video(8).column("channel", "8"))
            .await
            .unwrap();
        assert!(
            eventually(WAIT, || seen.messages() == [8]).await,
            "channel 8's row runs past the held key"
        );
        tokio::time::sleep(POLL * 20).await;
        assert_eq!(seen.messages(), [8], "channel 7's row waits for its key");
        assert_eq!(
            db.count("SELECT attempt FROM video_jobs WHERE channel = '7'")
                .await,
            0,
            "a row whose key is held is not taken: no attempt counted"
        );
        let released: Option<i64> = other
            .exec_first("SELECT RELEASE_LOCK(?)", (name.as_str(),))
            .await
            .unwrap();
        assert_eq!(released, Some(1));
        assert!(
            eventually(WAIT, || seen.messages() == [7, 8]).await,
            "channel 7's row runs once its key is free"
        );
    };
    service.run_until(stop).await.unwrap();
    other.disconnect().await.unwrap();
    assert_eq!(seen.all(), [(7, 1), (8, 1)]);
    assert_eq!(db.count("SELECT COUNT(*) FROM video_jobs").await, 0);
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_by_hand_releases_every_lock_and_closes_the_pool() {
    let db = TestDb::new("shutdown", &[VIDEO_JOBS]).await;
    let block = Block::new();
    let subscription = subscriber("videos", block.clone())
        .map_source(|_| InboxQueue::<VideoJob>::new("videos"))
        .workers(nonzero!(3))
        .poll_interval(POLL)
        .build()
        .into_subscription();
    let running = MySqlAsyncBroker::from_url(&db.url)
        .start([subscription])
        .await
        .expect("the broker starts");
    let videos = running.publisher::<VideoJob>();
    let channels = ["a", "b", "c"];
    for (n, channel) in channels.iter().enumerate() {
        videos
            .publish(video(n as u32).column("channel", *channel))
            .await
            .unwrap();
    }
    assert!(
        eventually(WAIT, || block.started() >= 3).await,
        "three handlers in work"
    );
    for channel in channels {
        assert!(
            db.holder(&format!("video_jobs-{channel}")).await.is_some(),
            "a session of the broker holds the key of {channel}"
        );
    }
    // A server kill ends one delivery's session: its unlock fails at the shutdown, and the
    // shutdown closes its connection instead.
    let killed = db.holder("video_jobs-c").await.expect("c's holder");
    db.exec(&format!("KILL CONNECTION {killed}")).await;
    assert!(
        eventually_async(WAIT, || db.key_free("video_jobs-c")).await,
        "the killed session's lock ends with it"
    );

    let pool = running.broker().pool().expect("the pool it built");
    let handle = running.handle().clone();
    let closed = running.shutdown().await;
    assert_eq!(
        closed,
        ruststream_mysql_async::ClosedMySqlAsyncBroker {
            locks_released: 2,
            connections_closed: 1,
        }
    );
    for channel in channels {
        assert_eq!(
            db.holder(&format!("video_jobs-{channel}")).await,
            None,
            "no lock of the broker is left: {channel}"
        );
    }
    assert!(handle.adapter().is_closed());
    assert!(
        eventually_async(Duration::from_secs(5), || db.sessions_are(0)).await,
        "no connection of the pool it built is left on the server"
    );
    assert!(
        matches!(
            pool.get_conn().await,
            Err(mysql_async::Error::Driver(
                mysql_async::DriverError::PoolDisconnected
            ))
        ),
        "the pool it built is disconnected"
    );
    let late = videos.publish(video(9).column("channel", "d")).await;
    assert!(
        matches!(late, Err(MySqlAsyncBrokerError::Closed)),
        "{late:?}"
    );
    assert_eq!(
        db.count("SELECT COUNT(*) FROM video_jobs").await,
        3,
        "the rows in work returned, and no row was written past the shutdown"
    );
    assert_eq!(
        db.count("SELECT COUNT(*) FROM video_jobs WHERE attempt = 1")
            .await,
        3,
        "each take spent its attempt"
    );
    // The handlers still in work finish; their settlements find the broker closed.
    block.open();
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_connection_returns_its_row_in_the_row_lock_form() {
    let db = TestDb::new("kill_row_lock", &[JOBS]).await;
    let route = MySqlAsyncBroker::from_url(&db.url).route::<Job>("jobs");
    let jobs = route.publisher();
    let block = Block::new();
    let service = service(route, |b| {
        b.include(
            subscriber("jobs", block.clone())
                .map_source(|_| InboxQueue::<Job>::new("jobs"))
                .poll_interval(POLL)
                .build(),
        );
    });
    let stop = async {
        jobs.publish(video(1)).await.unwrap();
        assert!(eventually(WAIT, || block.started() >= 1).await);
        // The session that holds the message's transaction.
        let mut conn = connect().await;
        let holder: Option<i64> = conn
            .exec_first(
                "SELECT t.trx_mysql_thread_id FROM information_schema.innodb_trx t \
                 JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id \
                 WHERE p.db = ?",
                (db.name.as_str(),),
            )
            .await
            .unwrap();
        let holder = holder.expect("a session holds the delivery's transaction");
        conn.query_drop(format!("KILL CONNECTION {holder}"))
            .await
            .unwrap();
        conn.disconnect().await.unwrap();
        // The handler acknowledges; the settlement fails on the killed connection, and the
        // row returns to the queue: the next take is attempt 2.
        block.open();
        assert!(
            eventually(WAIT, || block.seen.all() == [(1, 1), (1, 2)]).await,
            "the row returned and was taken again: {:?}",
            block.seen.all()
        );
        // The broker carries on.
        jobs.publish(video(2)).await.unwrap();
        assert!(eventually_async(WAIT, || db.count_is("SELECT COUNT(*) FROM jobs", 0)).await);
    };
    service.run_until(stop).await.unwrap();
    assert_eq!(block.seen.all(), [(1, 1), (1, 2), (2, 1)]);
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_connection_returns_its_row_in_the_advisory_form() {
    let db = TestDb::new("kill_advisory", &[VIDEO_JOBS]).await;
    let route = MySqlAsyncBroker::from_url(&db.url).route::<VideoJob>("videos");
    let videos = route.publisher();
    let block = Block::new();
    let service = service(route, |b| {
        b.include(
            subscriber("videos", block.clone())
                .map_source(|_| InboxQueue::<VideoJob>::new("videos"))
                .workers(nonzero!(2))
                .poll_interval(POLL)
                .build(),
        );
    });
    let stop = async {
        videos
            .publish(video(1).column("channel", "k"))
            .await
            .unwrap();
        assert!(eventually(WAIT, || block.started() >= 1).await);
        let holder = db
            .holder("video_jobs-k")
            .await
            .expect("the delivery's session holds its key");
        db.exec(&format!("KILL CONNECTION {holder}")).await;
        block.open();
        assert!(
            eventually(WAIT, || block.seen.all() == [(1, 1), (1, 2)]).await,
            "the row returned and was taken again: {:?}",
            block.seen.all()
        );
        videos
            .publish(video(2).column("channel", "k"))
            .await
            .unwrap();
        assert!(eventually_async(WAIT, || db.count_is("SELECT COUNT(*) FROM video_jobs", 0)).await);
    };
    service.run_until(stop).await.unwrap();
    assert_eq!(block.seen.all(), [(1, 1), (1, 2), (2, 1)]);
    assert_eq!(db.holder("video_jobs-k").await, None);
    db.cleanup().await;
}
