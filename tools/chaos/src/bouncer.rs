//! pooler's PgBouncer (Debian's `pgbouncer`): a process of the run's own on a port of its own,
//! in front of the run's PostgreSQL server in transaction pooling (`pool_mode = transaction`),
//! so each transaction of a service may run on another server session.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use crate::BoxError;

/// A PgBouncer process, killed when stopped or dropped.
pub struct Bouncer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

/// PgBouncer's binary, where Debian's package installs it.
fn binary() -> Result<PathBuf, BoxError> {
    ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .ok_or_else(|| {
            "pooler needs PgBouncer, which is not installed (install the Debian package \
             pgbouncer: apt-get install pgbouncer)"
                .into()
        })
}

impl Bouncer {
    /// Starts PgBouncer in transaction pooling in front of `host:port`, letting `user` in
    /// without a password (the server's own authentication still applies) to any database.
    pub async fn start(host: &str, port: u16, user: &str, tag: &str) -> Result<Self, BoxError> {
        let listen = crate::gate::Gate::shut()?.port();
        let dir = std::env::temp_dir().join(format!("{tag}-pgbouncer"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let ini = format!(
            "[databases]\n\
             * = host={host} port={port}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {listen}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {auth}\n\
             pool_mode = transaction\n\
             default_pool_size = 8\n\
             max_client_conn = 200\n\
             ignore_startup_parameters = extra_float_digits\n\
             logfile = {log}\n",
            auth = dir.join("users.txt").display(),
            log = dir.join("pgbouncer.log").display(),
        );
        std::fs::write(dir.join("pgbouncer.ini"), ini)?;
        std::fs::write(dir.join("users.txt"), format!("\"{user}\" \"\"\n"))?;
        let mut command = Command::new(binary()?);
        // PgBouncer does not run as root: as root, it switches to the `postgres` user itself,
        // so the child stays PgBouncer's own process and its kill ends it.
        if nix::unistd::Uid::effective().is_root() {
            let _ = std::process::Command::new("chmod")
                .args(["-R", "a+rwX"])
                .arg(&dir)
                .status();
            command.args(["-u", "postgres"]);
        }
        let child = command
            .arg(dir.join("pgbouncer.ini"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("pgbouncer does not start: {e}"))?;
        let since = Instant::now();
        while tokio::net::TcpStream::connect(("127.0.0.1", listen))
            .await
            .is_err()
        {
            if since.elapsed() > Duration::from_secs(10) {
                return Err(format!(
                    "pgbouncer did not listen on port {listen} within 10 s (its log: {})",
                    dir.join("pgbouncer.log").display()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(Self {
            child,
            port: listen,
            dir,
        })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops it: its server sessions end with it.
    pub async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
