//! PostgreSQL: the session that hears of rows other processes publish, on a connection of its
//! own, through `PgListener`. Without the `postgres` feature no database listens, and
//! [`Listener`] has no value.

#[cfg(feature = "postgres")]
pub(crate) use postgres::Listener;

/// No listening session: only PostgreSQL listens, and its feature is off.
#[cfg(not(feature = "postgres"))]
#[doc(hidden)]
#[derive(Debug)]
pub enum Listener {}

#[cfg(not(feature = "postgres"))]
impl Listener {
    pub(crate) fn open(
        &self,
    ) -> futures::future::BoxFuture<
        'static,
        Result<ruststream::adapter::Notifications, ruststream_core::DbError>,
    > {
        match *self {}
    }

    pub(crate) async fn close(self) {
        match self {}
    }
}

#[cfg(feature = "postgres")]
mod postgres {

    use std::time::Duration;

    use futures::StreamExt;
    use futures::future::BoxFuture;
    use ruststream::adapter::Notifications;
    use ruststream_core::{DbError, Dialect};
    use sqlx::AssertSqlSafe;
    use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions, Postgres};

    use crate::db::db_error;

    /// How long an opening waits for its connection.
    const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

    /// The listening sessions of a broker on PostgreSQL: a pool of one connection, opened with the
    /// broker's own connect options (its `application_name` too), apart from the pool that runs
    /// the queue's statements.
    #[doc(hidden)]
    pub struct Listener {
        pool: PgPool,
    }

    impl std::fmt::Debug for Listener {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Listener").finish_non_exhaustive()
        }
    }

    impl Listener {
        /// Sessions on connections of these options. Nothing connects here.
        pub(crate) fn new(options: PgConnectOptions) -> Self {
            let pool = PgPoolOptions::new()
                .max_connections(1)
                .min_connections(0)
                .idle_timeout(None)
                .max_lifetime(None)
                .acquire_timeout(CONNECT_TIMEOUT)
                .connect_lazy_with(options);
            Self { pool }
        }

        /// Opens a session: a connection that ran `LISTEN ruststream`. Its stream ends when the
        /// connection is lost (the runtime opens another); dropping it unlistens and gives the
        /// connection back.
        pub(crate) fn open(&self) -> BoxFuture<'static, Result<Notifications, DbError>> {
            let pool = self.pool.clone();
            Box::pin(async move {
                let failed = |e: sqlx::Error| db_error::<Postgres>(&e);
                let mut listener = PgListener::connect_with(&pool).await.map_err(failed)?;
                // A lost connection ends the session rather than reconnecting inside it: the
                // runtime then opens another and wakes every subscription.
                listener.eager_reconnect(false);
                let listen = Dialect::Postgres
                    .listen_statement()
                    .expect("PostgreSQL listens");
                sqlx::raw_sql(AssertSqlSafe(listen))
                    .execute(&mut listener)
                    .await
                    .map_err(failed)?;
                let notifications =
                    futures::stream::unfold(Some(listener), |listener| async move {
                        let mut listener = listener?;
                        match listener.try_recv().await {
                            Ok(Some(notification)) => {
                                Some((Ok(notification.payload().to_owned()), Some(listener)))
                            }
                            Ok(None) => None,
                            Err(error) => Some((Err(db_error::<Postgres>(&error)), None)),
                        }
                    });
                Ok(notifications.boxed())
            })
        }

        /// Closes the pool once its connection is back and closed: the runtime drops the stream of
        /// a session before it closes the broker, and the dropped listener gives its connection
        /// back.
        pub(crate) async fn close(self) {
            self.pool.close().await;
        }
    }
}
