//! A throwaway PostgreSQL server for db_restart, which restarts it: never the shared one.
//!
//! `initdb` in a fresh temporary directory, on a free port of 127.0.0.1, TCP only, durability
//! off (the data is thrown away); `pg_ctl restart -m fast` to restart it; stopped and removed
//! at the end. As the `postgres` user when running as root (PostgreSQL refuses root), as
//! scripts/test starts its own.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::Command;

use crate::BoxError;

/// A running throwaway server.
pub struct Cluster {
    bin: PathBuf,
    base: PathBuf,
    user: Option<&'static str>,
    port: u16,
}

/// The newest `/usr/lib/postgresql/*/bin` with initdb and pg_ctl.
fn find_bin() -> Option<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            (bin.join("initdb").exists() && bin.join("pg_ctl").exists()).then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin)
}

fn free_port() -> Result<u16, BoxError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

impl Cluster {
    /// Starts a server with the binaries of `bin` (or the newest installed).
    pub async fn start(bin: Option<&Path>) -> Result<Self, BoxError> {
        let bin = match bin {
            Some(bin) => bin.to_owned(),
            None => find_bin().ok_or(
                "db_restart needs PostgreSQL's initdb and pg_ctl (under /usr/lib/postgresql/*/bin, \
                 or --pg-bin)",
            )?,
        };
        let user = nix::unistd::geteuid().is_root().then_some("postgres");
        let base = std::env::temp_dir().join(format!(
            "ruststream-chaos-pg-{}-{}",
            std::process::id(),
            crate::child::now_us()
        ));
        std::fs::create_dir_all(&base)?;
        let cluster = Self {
            bin,
            base,
            user,
            port: free_port()?,
        };
        if let Some(user) = user {
            cluster
                .run("chown", &[&format!("{user}:"), &cluster.path("")], false)
                .await?;
        }
        let data = cluster.path("data");
        cluster
            .run(
                &cluster.tool("initdb"),
                &[
                    "-D",
                    &data,
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--no-locale",
                ],
                true,
            )
            .await?;
        let conf = format!(
            "\n# ruststream-chaos: a throwaway server\nlisten_addresses = '127.0.0.1'\n\
             port = {}\nunix_socket_directories = ''\nmax_connections = 200\nfsync = off\n\
             synchronous_commit = off\nfull_page_writes = off\n",
            cluster.port
        );
        let conf_path = cluster.base.join("data").join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf_path)?;
        text.push_str(&conf);
        std::fs::write(&conf_path, text)?;
        cluster.pg_ctl(&["start"]).await?;
        Ok(cluster)
    }

    fn path(&self, name: &str) -> String {
        self.base.join(name).to_string_lossy().into_owned()
    }

    fn tool(&self, name: &str) -> String {
        self.bin.join(name).to_string_lossy().into_owned()
    }

    /// Runs `program` (as the server's user where `as_user`), from `/`.
    async fn run(&self, program: &str, args: &[&str], as_user: bool) -> Result<(), BoxError> {
        let mut command = match (as_user, self.user) {
            (true, Some(user)) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--", program]);
                c
            }
            _ => Command::new(program),
        };
        let output = command
            .args(args)
            .current_dir("/")
            .stdin(Stdio::null())
            .output()
            .await?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{program} {}: {}: {}",
                args.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )
            .into())
        }
    }

    async fn pg_ctl(&self, action: &[&str]) -> Result<(), BoxError> {
        let data = self.path("data");
        let log = self.path("server.log");
        let mut args = vec!["-D", &data, "-l", &log, "-w", "-t", "60", "-m", "fast"];
        args.extend_from_slice(action);
        self.run(&self.tool("pg_ctl"), &args, true).await
    }

    /// The URL of the server's `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Restarts the server (`pg_ctl restart -m fast`): every session ends.
    pub async fn restart(&self) -> Result<(), BoxError> {
        self.pg_ctl(&["restart"]).await
    }

    /// Stops the server and removes its directory.
    pub async fn stop(self) {
        if let Err(error) = self.pg_ctl(&["stop"]).await {
            eprintln!("ruststream-chaos: stopping the throwaway PostgreSQL: {error}");
        }
        let _ = std::fs::remove_dir_all(&self.base);
    }
}
