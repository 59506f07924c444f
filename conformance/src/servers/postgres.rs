//! A throwaway PostgreSQL server that takes TLS sessions only, for the TLS tests of the
//! tokio-postgres and sqlx adapters, or any session (`TlsServer::plain`), for their pooler
//! tests. Never the shared server on 5432.
//!
//! It starts as tools/chaos/src/cluster.rs starts its own: `initdb` in a fresh temporary
//! directory, on a free port of 127.0.0.1, TCP only, durability off (the data is thrown away),
//! as the `postgres` user when running as root (PostgreSQL refuses root); it is stopped and its
//! directory removed when dropped. Besides that: `ssl = on`, with a server certificate for
//! `127.0.0.1` and `localhost` signed by a CA made for the test (rcgen), and a pg_hba.conf of
//! one line, `hostssl all all 127.0.0.1/32 trust`, with no `host` line: a session without TLS
//! is refused.
//!
//! Without `initdb` and `pg_ctl` (Debian's `postgresql` package, which scripts/test installs
//! where they are missing) the test fails, saying so: it never passes without its server.

use std::io::Write;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A running throwaway server that takes TLS sessions only.
pub struct TlsServer {
    bin: PathBuf,
    base: PathBuf,
    user: Option<&'static str>,
    port: u16,
    ca_der: Vec<u8>,
}

/// The newest `/usr/lib/postgresql/*/bin` with initdb and pg_ctl, else a directory of `PATH`
/// that has both (as scripts/test looks for them).
fn find_bin() -> Option<PathBuf> {
    let has_tools = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            has_tools(&bin).then_some((version, bin))
        })
        .collect();
    found.sort();
    if let Some((_, bin)) = found.pop() {
        return Some(bin);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).find(|dir| has_tools(dir))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port on 127.0.0.1")
        .port()
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// The test CA's certificate (DER and PEM), and the server's certificate and key (PEM),
/// valid for `127.0.0.1` and `localhost`.
struct Certificates {
    ca_der: Vec<u8>,
    ca_pem: String,
    server_pem: String,
    server_key_pem: String,
}

fn certificates() -> Certificates {
    let ca_key = KeyPair::generate().expect("the test CA's key");
    let mut ca = CertificateParams::new(Vec::new()).expect("the test CA's parameters");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "ruststream TLS test CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).expect("the test CA's certificate");
    let issuer = Issuer::new(ca, ca_key);

    let server_key = KeyPair::generate().expect("the server's key");
    let mut server = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .expect("the server certificate's parameters");
    server
        .distinguished_name
        .push(DnType::CommonName, "127.0.0.1");
    server.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server_cert = server
        .signed_by(&server_key, &issuer)
        .expect("the server's certificate, signed by the test CA");
    Certificates {
        ca_der: ca_cert.der().to_vec(),
        ca_pem: ca_cert.pem(),
        server_pem: server_cert.pem(),
        server_key_pem: server_key.serialize_pem(),
    }
}

impl TlsServer {
    /// Starts a server for the test `name`, or fails the test saying why.
    pub fn start(name: &str) -> Self {
        Self::start_with(name, true)
    }

    /// Starts a server that takes sessions without TLS, for a test that needs a fresh server
    /// of its own rather than the shared one (the pooler tests).
    pub fn plain(name: &str) -> Self {
        Self::start_with(name, false)
    }

    fn start_with(name: &str, tls: bool) -> Self {
        let server = Self::prepared(name);
        let data = server.path("data");
        server.run(
            &server.tool("initdb"),
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
        );
        server.configure(tls);
        server.chown();
        server.pg_ctl("start");
        server
    }

    /// A server's directory, with the test CA's certificates and keys, owned by the user the
    /// server runs as; not initialized yet.
    fn prepared(name: &str) -> Self {
        let bin = find_bin().unwrap_or_else(|| {
            panic!(
                "this TLS test starts a throwaway PostgreSQL of its own and needs initdb and \
                 pg_ctl: none under /usr/lib/postgresql/*/bin or on PATH. Install PostgreSQL's \
                 server binaries (Debian's `postgresql` package; scripts/test installs it where \
                 missing)"
            )
        });
        let user = is_root().then_some("postgres");
        if let Some(user) = user {
            let known = Command::new("id")
                .args(["-u", user])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            assert!(
                known,
                "running as root, this TLS test runs its throwaway PostgreSQL as the user \
                 `{user}` (PostgreSQL refuses root), and there is no such user"
            );
        }
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let base = std::env::temp_dir().join(format!(
            "ruststream-tls-{name}-{}-{stamp}",
            std::process::id()
        ));
        std::fs::create_dir_all(&base).unwrap_or_else(|e| panic!("create {}: {e}", base.display()));
        let certs = certificates();
        let server = Self {
            bin,
            base,
            user,
            port: free_port(),
            ca_der: certs.ca_der,
        };
        server.write("ca.crt", &certs.ca_pem, 0o644);
        server.write("server.crt", &certs.server_pem, 0o644);
        // PostgreSQL takes a key that its user owns and no one else reads.
        server.write("server.key", &certs.server_key_pem, 0o600);
        server.chown();
        server
    }

    /// The initialized server's settings: its port, durability off, TLS where `tls`, and who
    /// may connect (TLS sessions only where `tls`).
    fn configure(&self, tls: bool) {
        let ssl = if tls {
            format!(
                "ssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\n",
                self.path("server.crt"),
                self.path("server.key"),
            )
        } else {
            String::new()
        };
        let conf = format!(
            "\n# ruststream test: a throwaway server\nlisten_addresses = '127.0.0.1'\n\
             port = {port}\nunix_socket_directories = ''\nmax_connections = 100\nfsync = off\n\
             synchronous_commit = off\nfull_page_writes = off\n{ssl}log_connections = on\n",
            port = self.port,
        );
        let conf_path = self.base.join("data").join("postgresql.conf");
        std::fs::OpenOptions::new()
            .append(true)
            .open(&conf_path)
            .and_then(|mut f| f.write_all(conf.as_bytes()))
            .unwrap_or_else(|e| panic!("append to {}: {e}", conf_path.display()));
        // TLS sessions only: no `host` line, so a session without TLS finds no entry.
        let hba = if tls {
            "# ruststream TLS test: TLS sessions only\nhostssl all all 127.0.0.1/32 trust\n"
        } else {
            "# ruststream test: any session from this machine\nhost all all 127.0.0.1/32 trust\n"
        };
        std::fs::write(self.base.join("data").join("pg_hba.conf"), hba).expect("write pg_hba.conf");
    }

    /// Keeps the server for the rest of the test process: a watchdog stops it and removes its
    /// directory once this process has exited, for a server that tests of one binary share.
    // The watchdog outlives this process by design: it is never waited on.
    #[allow(clippy::zombie_processes)]
    pub fn stop_at_exit(self) {
        let runuser = self
            .user
            .map(|u| format!("runuser -u {u} -- "))
            .unwrap_or_default();
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; \
             {runuser}'{pg_ctl}' -D '{data}' -m immediate -w -t 30 stop && rm -rf '{base}'",
            pid = std::process::id(),
            pg_ctl = self.tool("pg_ctl"),
            data = self.path("data"),
            base = self.base.display(),
        );
        Command::new("sh")
            .args(["-c", &script])
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the throwaway server's watchdog starts");
        std::mem::forget(self);
    }

    /// The URL of the server's `postgres` database, with `query` (`?sslmode=..`) after it.
    pub fn url(&self, query: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres{query}",
            self.port
        )
    }

    /// The test CA's certificate, DER-encoded.
    pub fn ca_der(&self) -> &[u8] {
        &self.ca_der
    }

    /// The file of the test CA's certificate, PEM-encoded.
    pub fn ca_file(&self) -> PathBuf {
        self.base.join("ca.crt")
    }

    /// The end of the server's log, for a failure's message.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.base.join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    fn path(&self, name: &str) -> String {
        self.base.join(name).to_string_lossy().into_owned()
    }

    fn tool(&self, name: &str) -> String {
        self.bin.join(name).to_string_lossy().into_owned()
    }

    fn write(&self, name: &str, text: &str, mode: u32) {
        let path = self.base.join(name);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
            .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
    }

    /// Gives the directory to the server's user, when that is not who runs the test.
    fn chown(&self) {
        if let Some(user) = self.user {
            let status = Command::new("chown")
                .args(["-R", &format!("{user}:")])
                .arg(&self.base)
                .status()
                .expect("run chown");
            assert!(status.success(), "chown -R {user}: {}", self.base.display());
        }
    }

    /// Runs `program` as the server's user, from `/`, or fails the test with its output.
    fn run(&self, program: &str, args: &[&str]) {
        let mut command = match self.user {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--", program]);
                c
            }
            None => Command::new(program),
        };
        let output = command
            .args(args)
            .current_dir("/")
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run {program}: {e}"));
        assert!(
            output.status.success(),
            "{program} {}: {}: {}\n{}\nserver log:\n{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stdout).trim(),
            String::from_utf8_lossy(&output.stderr).trim(),
            self.log_tail()
        );
    }

    fn pg_ctl(&self, action: &str) {
        let data = self.path("data");
        let log = self.path("server.log");
        self.run(
            &self.tool("pg_ctl"),
            &[
                "-D", &data, "-l", &log, "-w", "-t", "60", "-m", "fast", action,
            ],
        );
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let data = self.path("data");
        let mut command = match self.user {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]);
                c.arg(self.tool("pg_ctl"));
                c
            }
            None => Command::new(self.tool("pg_ctl")),
        };
        let stopped = command
            .args(["-D", &data, "-m", "immediate", "-w", "-t", "30", "stop"])
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if stopped {
            let _ = std::fs::remove_dir_all(&self.base);
        } else {
            eprintln!(
                "the throwaway PostgreSQL of {} did not stop; its directory is left",
                self.base.display()
            );
        }
    }
}
