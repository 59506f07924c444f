//! A service whose start cannot succeed, as an operator meets it: a process of its own, with
//! no `tracing` subscriber installed, on every adapter.
//!
//! - A server that refuses connections: the start says why on standard error at once, again
//!   after a wait that grows, and SIGTERM stops the process within its shutdown timeout.
//! - A server that accepts connections and never answers: SIGTERM stops the process within
//!   its shutdown timeout.
//! - A cause that waiting cannot cure (a user the server does not know, a file that cannot
//!   open): the start fails at once with the error, and the process exits on its own.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ruststream::{
    AppInfo, Context, Handle, HandlerOutcome, Inbox, InboxQueue, RustStream, subscriber,
};
use ruststream_mysql_async::MySqlAsyncBroker;
use ruststream_rusqlite::RusqliteBroker;
use ruststream_sqlx::SqlxBroker;
use ruststream_tokio_postgres::TokioPostgresBroker;
use ruststream_tokio_postgres::deadpool_postgres::PoolConfig;
use serde::Deserialize;
use serde::de::IgnoredAny;
use sqlx::mysql::MySqlPoolOptions;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::SqlitePoolOptions;

/// Set in the child: `<adapter> <url>`.
const CHILD: &str = "RUSTSTREAM_START_STOPS_CHILD";
/// The child's shutdown timeout.
const SHUTDOWN: Duration = Duration::from_secs(5);
/// How long past the shutdown timeout the child may take to exit on SIGTERM: a loaded
/// two-core machine.
const MARGIN: Duration = Duration::from_secs(5);

/// Rows of sqlx on the servers, in the row lock form.
#[derive(Inbox, sqlx::FromRow)]
#[inbox(table = "start_jobs")]
struct SqlxJob {
    #[field(id, generated)]
    id: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

/// Rows of sqlx on SQLite, in the lease form.
#[derive(Inbox, sqlx::FromRow)]
#[inbox(table = "start_jobs")]
struct SqlxLiteJob {
    #[field(id, generated)]
    id: i64,
    #[field(payload)]
    payload: Vec<u8>,
    #[field(locked_until)]
    locked_until: Option<i64>,
}

/// Rows of tokio-postgres.
#[derive(Inbox, Deserialize)]
#[inbox(table = "start_jobs")]
struct PgJob {
    #[field(id, generated)]
    id: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

/// Rows of mysql_async.
#[derive(Inbox, ruststream_mysql_async::prelude::FromRow)]
#[inbox(table = "start_jobs")]
struct MyJob {
    #[field(id, generated)]
    id: i64,
    #[field(payload)]
    payload: Vec<u8>,
}

/// Rows of rusqlite, in the lease form.
#[derive(Inbox, Deserialize)]
#[inbox(table = "start_jobs")]
struct LiteJob {
    #[field(id, generated)]
    id: i64,
    #[field(payload)]
    payload: Vec<u8>,
    #[field(locked_until)]
    locked_until: Option<i64>,
}

struct Work;

impl Handle<IgnoredAny> for Work {
    fn handle(
        &self,
        _: &IgnoredAny,
        _: &(),
        _: &mut Context<'_>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> {
        std::future::ready(Ok(()))
    }
}

/// The service of `$row`'s table on `$broker`.
macro_rules! service {
    ($info:expr, $broker:expr, $row:ty) => {
        RustStream::new($info).with_broker($broker, |b| {
            let jobs = subscriber("start_jobs", Work)
                .map_source(|_| InboxQueue::<$row>::new("start_jobs"));
            b.include(jobs.build());
        })
    };
}

/// The child: the service on `adapter` at `url`, until SIGTERM.
fn child(adapter: &str, url: &str) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let info = AppInfo::new("start-stops", "0.1.0");
    let wait = Duration::from_secs(3);
    let service = match adapter {
        "sqlx-postgres" => {
            let pool = PgPoolOptions::new().acquire_timeout(wait);
            service!(info, SqlxBroker::from_url(url.to_owned(), pool), SqlxJob)
        }
        "sqlx-mysql" => {
            let pool = MySqlPoolOptions::new().acquire_timeout(wait);
            service!(info, SqlxBroker::from_url(url.to_owned(), pool), SqlxJob)
        }
        "sqlx-sqlite" => {
            let pool = SqlitePoolOptions::new();
            service!(
                info,
                SqlxBroker::from_url(url.to_owned(), pool),
                SqlxLiteJob
            )
        }
        "tokio-postgres" => {
            let mut pool = PoolConfig::new(4);
            pool.timeouts.wait = Some(wait);
            pool.timeouts.create = Some(wait);
            service!(
                info,
                TokioPostgresBroker::from_url(url.to_owned(), pool),
                PgJob
            )
        }
        "mysql-async" => service!(info, MySqlAsyncBroker::from_url(url.to_owned()), MyJob),
        "rusqlite" => service!(info, RusqliteBroker::open(url).handle(), LiteJob),
        other => panic!("no adapter {other}"),
    };
    match runtime.block_on(service.shutdown_timeout(SHUTDOWN).run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::from(3)
        }
    }
}

/// A child process and the lines of its standard error, with when each came.
struct Service {
    child: Child,
    lines: Arc<Mutex<Vec<(Instant, String)>>>,
    started: Instant,
}

impl Service {
    fn spawn(adapter: &str, url: &str) -> Self {
        let exe = std::env::current_exe().expect("the test binary");
        let mut child = Command::new(exe)
            .args(["child_entry", "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD, format!("{adapter} {url}"))
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the child starts");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let into = lines.clone();
        let stderr = child.stderr.take().expect("piped");
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                into.lock()
                    .expect("not poisoned")
                    .push((Instant::now(), line));
            }
        });
        Self {
            child,
            lines,
            started: Instant::now(),
        }
    }

    fn said(&self, what: &str) -> Vec<Instant> {
        self.lines
            .lock()
            .expect("not poisoned")
            .iter()
            .filter(|(_, l)| l.contains(what))
            .map(|(at, _)| *at)
            .collect()
    }

    fn stderr(&self) -> String {
        let lines = self.lines.lock().expect("not poisoned");
        lines
            .iter()
            .map(|(_, l)| l.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits until the child said `what` `times` times, for at most `within`.
    fn wait_said(&self, what: &str, times: usize, within: Duration) -> Vec<Instant> {
        let deadline = Instant::now() + within;
        loop {
            let said = self.said(what);
            if said.len() >= times {
                return said;
            }
            assert!(
                Instant::now() < deadline,
                "the service did not say {what:?} {times} times within {within:?}; it said:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for the child to exit, for at most `within`; its status.
    fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("the child's status") {
                return status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                panic!(
                    "the service did not exit within {within:?}; it said:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn sigterm(&self) {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "SIGTERM sent");
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The entry the child runs as (a test that does nothing in the parent).
#[test]
fn child_entry() {
    if let Ok(spec) = std::env::var(CHILD) {
        let (adapter, url) = spec.split_once(' ').expect("<adapter> <url>");
        std::process::exit(i32::from(child(adapter, url) != ExitCode::SUCCESS) * 3);
    }
}

/// A port nothing listens on.
fn refused_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a port");
    listener.local_addr().expect("its address").port()
}

/// A port that accepts connections and never answers: the returned listener keeps them.
fn silent_port() -> (u16, Arc<Mutex<Vec<std::net::TcpStream>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = listener.local_addr().expect("its address").port();
    let held = Arc::new(Mutex::new(Vec::new()));
    let keep = held.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            keep.lock().expect("not poisoned").push(stream);
        }
    });
    (port, held)
}

/// The servers' adapters and a URL of theirs at `127.0.0.1:port` as `user`.
fn servers(port: u16, user: &str) -> [(&'static str, String); 4] {
    let pg = format!("postgres://{user}@127.0.0.1:{port}/test");
    let my = format!("mysql://{user}@127.0.0.1:{port}/test");
    [
        ("sqlx-postgres", pg.clone()),
        ("tokio-postgres", pg),
        ("sqlx-mysql", my.clone()),
        ("mysql-async", my),
    ]
}

#[test]
fn a_refused_connection_is_reported_at_once_and_again_later_and_sigterm_stops_the_start() {
    for (adapter, url) in servers(refused_port(), "postgres") {
        let mut service = Service::spawn(adapter, &url);
        let said = service.wait_said("cannot start", 2, Duration::from_secs(20));
        assert!(
            said[0] - service.started < Duration::from_secs(10),
            "{adapter}: the first failure is reported at once"
        );
        assert!(
            said[1] - said[0] >= Duration::from_millis(900),
            "{adapter}: the second after a wait:\n{}",
            service.stderr()
        );
        let text = service.stderr();
        assert!(
            text.contains(&format!("127.0.0.1:{}", url_port(&url))) && text.contains("start_jobs"),
            "{adapter}: the report names the server and the table:\n{text}"
        );
        let sent = Instant::now();
        service.sigterm();
        let status = service.wait_exit(SHUTDOWN + MARGIN);
        assert!(
            status.success(),
            "{adapter}: {status}\n{}",
            service.stderr()
        );
        eprintln!(
            "{adapter}: refused, exited {:?} after SIGTERM",
            sent.elapsed()
        );
    }
}

#[test]
fn sigterm_stops_a_start_the_server_never_answers() {
    let (port, _held) = silent_port();
    for (adapter, url) in servers(port, "postgres") {
        let mut service = Service::spawn(adapter, &url);
        std::thread::sleep(Duration::from_secs(2));
        assert!(
            service.child.try_wait().expect("status").is_none(),
            "{adapter}: still starting:\n{}",
            service.stderr()
        );
        let sent = Instant::now();
        service.sigterm();
        let status = service.wait_exit(SHUTDOWN + MARGIN);
        assert!(
            status.success(),
            "{adapter}: {status}\n{}",
            service.stderr()
        );
        eprintln!(
            "{adapter}: silent, exited {:?} after SIGTERM",
            sent.elapsed()
        );
    }
}

#[test]
fn a_cause_that_waiting_cannot_cure_fails_the_start_at_once() {
    let pg = std::env::var("RUSTSTREAM_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let my = std::env::var("RUSTSTREAM_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
    let unknown = |url: &str, user: &str| {
        match url.split_once("://") {
            Some((scheme, rest)) => {
                let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
                format!("{scheme}://no_such_user_rs:wrong@{host}")
            }
            None => panic!("not a URL: {url}"),
        }
        .replace("no_such_user_rs", user)
    };
    let missing = std::env::temp_dir().join("ruststream-no-such-dir/queue.db");
    let cases = [
        ("sqlx-postgres", unknown(&pg, "no_such_user_rs")),
        ("tokio-postgres", unknown(&pg, "no_such_user_rs")),
        ("sqlx-mysql", unknown(&my, "no_such_user_rs")),
        ("mysql-async", unknown(&my, "no_such_user_rs")),
        ("sqlx-sqlite", format!("sqlite://{}", missing.display())),
        ("rusqlite", missing.display().to_string()),
    ];
    for (adapter, url) in cases {
        let mut service = Service::spawn(adapter, &url);
        let status = service.wait_exit(Duration::from_secs(20));
        assert!(!status.success(), "{adapter}: the start failed");
        let text = service.stderr();
        assert!(
            text.contains("error:") && !text.contains("trying again"),
            "{adapter}: failed at once, with the error:\n{text}"
        );
    }
}

fn url_port(url: &str) -> u16 {
    url.rsplit_once(':')
        .and_then(|(_, rest)| rest.split('/').next())
        .and_then(|p| p.parse().ok())
        .expect("a port")
}
