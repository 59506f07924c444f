//! A PgBouncer of a test's own (Debian's `pgbouncer`, which `scripts/test` installs where it is
//! missing) in front of a PostgreSQL server, in session or transaction pooling: the pooler
//! tests of the PostgreSQL adapters. Killed, and its directory removed, when dropped.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How PgBouncer lends its server sessions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// A server session per client session.
    Session,
    /// A server session per transaction: the next transaction may run on another.
    Transaction,
}

impl Pooling {
    fn mode(self) -> &'static str {
        match self {
            Self::Session => "session",
            Self::Transaction => "transaction",
        }
    }
}

/// A running PgBouncer.
pub struct Bouncer {
    child: Child,
    port: u16,
    dir: PathBuf,
    user: String,
    /// The application name its clients give: the test's schema.
    name: String,
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The installed PgBouncer; panics, saying how to get it, where there is none.
fn pgbouncer() -> PathBuf {
    ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .expect(
            "pgbouncer is not installed: install Debian's pgbouncer package (scripts/test does)",
        )
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

impl Bouncer {
    /// Starts PgBouncer in `pooling` in front of the server and database of `target` (a
    /// `postgres://` URL), every server session on `schema`, which is also the application
    /// name its clients give.
    pub fn start(pooling: Pooling, target: &str, schema: &str) -> Self {
        let target = url::Url::parse(target).expect("the server's URL parses");
        let host = target.host_str().unwrap_or("127.0.0.1").to_owned();
        let port = target.port().unwrap_or(5432);
        let dbname = crate::urls::database_of(target.as_str())
            .unwrap_or("test")
            .to_owned();
        let user = match target.username() {
            "" => "postgres".to_owned(),
            user => user.to_owned(),
        };
        let mode = pooling.mode();
        let listen = free_port();
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, Ordering::SeqCst);
        let dir =
            std::env::temp_dir().join(format!("rs-pgbouncer-{mode}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("the pgbouncer directory");
        let ini = format!(
            "[databases]\n\
             bounced = host={host} port={port} dbname={dbname} user={user} connect_query='SET search_path = {schema}'\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {listen}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {auth}\n\
             pool_mode = {mode}\n\
             default_pool_size = 8\n\
             ignore_startup_parameters = extra_float_digits\n\
             logfile = {log}\n",
            auth = dir.join("users.txt").display(),
            log = dir.join("pgbouncer.log").display(),
        );
        std::fs::write(dir.join("pgbouncer.ini"), ini).expect("pgbouncer.ini");
        std::fs::write(dir.join("users.txt"), format!("\"{user}\" \"\"\n")).expect("users.txt");
        let child = spawn(&dir);
        let since = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", listen)).is_err() {
            assert!(
                since.elapsed() < Duration::from_secs(10),
                "pgbouncer did not listen on {listen} within 10 s (log in {})",
                dir.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            port: listen,
            dir,
            user,
            name: schema.to_owned(),
        }
    }

    /// The URL of the pooler. PgBouncer sets the client's application name on each server
    /// session it lends it, so the sessions and locks a test counts are its own clients'.
    pub fn url(&self) -> String {
        format!(
            "postgres://{}@127.0.0.1:{}/bounced?application_name={}",
            self.user, self.port, self.name
        )
    }
}

/// Runs PgBouncer on the configuration in `dir`. PgBouncer does not run as root: as root, it
/// switches to the `postgres` user itself, so the child is PgBouncer's own process and its kill
/// ends it.
fn spawn(dir: &std::path::Path) -> Child {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    let mut command = Command::new(pgbouncer());
    if root {
        let _ = Command::new("chmod")
            .args(["-R", "a+rwX"])
            .arg(dir)
            .status();
        command.args(["-u", "postgres"]);
    }
    command
        .arg(dir.join("pgbouncer.ini"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("pgbouncer starts")
}
