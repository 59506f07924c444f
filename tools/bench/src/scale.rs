//! Scaling out: the ruststream side as several processes on one table (`--processes N`), and
//! keys a session of the bench's own holds for the whole run (`--held-keys H`).
//!
//! **Processes.** With `--processes N` above 1 the parent prepares and fills the table once,
//! then spawns N children: the bench's own binary (`std::env::current_exe()`) with the same
//! arguments and the environment variable `RUSTSTREAM_BENCH_CHILD` set to the child's index.
//! Each child runs one service (the adapter's broker with one subscription of W workers and
//! its own pool of W + 2 connections, as the one-process run has) on the same table. They talk
//! over the child's standard input and output, one JSON line a message:
//!
//! 1. the child builds its broker (nothing connects yet) and writes `{"msg":"ready"}`;
//! 2. once every child is ready the parent reads the clock and writes `go` to each; the child
//!    starts its broker (its start-up check inside the clock, as in one process);
//! 3. while it runs, the child writes `{"msg":"progress","settled":n}` whenever its count of
//!    settled rows changed (checked every millisecond);
//! 4. when the children's counts add up to the rows the run settles, the parent writes `stop`
//!    to each (a closed standard input stops a child too); the child stops its claims, waits
//!    for its handlers, shuts its broker down (every lock released, the pool closed:
//!    [shutdown](https://github.com/ruststream/ruststream/blob/main/docs/src/shutdown.md)), writes `{"msg":"done","report":{..}}` and exits.
//!
//! The rate is the rows settled over the time from the parent's `go` to the last settlement of
//! any child (each child's last settlement on the wall clock, which the processes of one
//! machine share). The report carries each child's settled rows (`per_process_jobs`), its
//! statements, its pickup latencies (measured in the child against the insert time in the
//! payload, the wall clock) and settle latencies (handler end to settle reply, within the
//! child), which the parent merges; its peak connections, which the parent adds up (the sum of
//! each process's most at once); its `VmHWM`, of which the parent reports the largest; and, in
//! the advisory form, each handler's start and end by key, which the parent merges and checks
//! (tools/bench/src/order.rs). After the children exit, the parent counts the table's rows:
//! only the held keys' rows may be left.
//!
//! **Held keys.** With `--held-keys H` the parent opens a connection of its own, not the
//! broker's or the baseline's, and before each run (both sides) takes the locks of the last H
//! keys as the core names them, `bench-{k}`: on PostgreSQL `pg_try_advisory_lock` on
//! [`postgres_key_hash`], on MySQL/MariaDB `GET_LOCK(.., 0)` on [`mysql_lock_name`] of the
//! database's name; it releases them after the run. The run ends when the other keys' rows
//! are settled.

use std::io::{BufRead, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use ruststream::core::Value;
use ruststream::core::keys::{mysql_lock_name, postgres_key_hash};
use serde::{Deserialize, Serialize};
use sqlx::Connection;
use tokio::sync::mpsc;

use crate::baseline::RawConn;
use crate::stats::{Report, Stats, now_us};
use crate::{BoxError, Config, Database};

/// The environment variable that makes the bench's binary a child of a `--processes` run: the
/// child's index.
pub const CHILD_ENV: &str = "RUSTSTREAM_BENCH_CHILD";

/// How long a child may take to get ready, and a run to go without a settlement.
const PATIENCE: Duration = Duration::from_secs(60);

/// A child's message to the parent.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
enum ToParent {
    /// The broker is built; the child waits for `go`.
    Ready,
    /// The rows the child settled so far.
    Progress { settled: u64 },
    /// The service is shut down: what the child measured.
    Done { report: Box<Report> },
}

fn say(message: &ToParent) -> Result<(), BoxError> {
    let line = serde_json::to_string(message)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

/// The child's side: waits for `go`, runs its service until `stop` (or the end of its standard
/// input), and reports.
pub(crate) async fn child_main(config: &Config) -> Result<(), BoxError> {
    let (tx, mut lines) = mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line.trim().to_owned()).is_err() {
                break;
            }
        }
    });
    let stats = Arc::new(Stats::new(ProgressBar::hidden()));
    say(&ToParent::Ready)?;
    match lines.recv().await.as_deref() {
        Some("go") => {}
        // The parent is gone, or stopped the run before it began.
        _ => return Ok(()),
    }
    let progress = stats.clone();
    let until = async move {
        let mut told = 0;
        loop {
            tokio::select! {
                line = lines.recv() => match line.as_deref() {
                    Some("stop") | None => return Ok(()),
                    Some(_) => {}
                },
                () = tokio::time::sleep(Duration::from_millis(1)) => {
                    let settled = progress.settled();
                    if settled != told {
                        told = settled;
                        say(&ToParent::Progress { settled })?;
                    }
                }
            }
        }
    };
    crate::run_framework(config, stats.clone(), until).await?;
    say(&ToParent::Done {
        report: Box::new(stats.report()),
    })
}

/// What the children of one run did.
pub(crate) struct Children {
    /// From the parent's `go` to the last settlement of any child.
    pub(crate) elapsed: Duration,
    /// The rows each child settled.
    pub(crate) per_process_jobs: Vec<u64>,
    /// The largest `VmHWM` of the children, KiB.
    pub(crate) peak_memory_kib: Option<u64>,
}

/// The children of a run; any still running when this is dropped is killed (an error ended
/// the run).
struct Procs {
    procs: Vec<Child>,
    stdins: Vec<Option<ChildStdin>>,
}

impl Procs {
    fn tell(&mut self, line: &str) {
        for stdin in self.stdins.iter_mut() {
            let sent = stdin
                .as_mut()
                .map(|s| writeln!(s, "{line}").and_then(|()| s.flush()));
            if !matches!(sent, Some(Ok(()))) {
                *stdin = None;
            }
        }
    }

    /// Closes every child's standard input, which stops it, and waits up to `patience` for
    /// them to exit.
    fn close(&mut self, patience: Duration) -> Vec<Option<std::process::ExitStatus>> {
        self.stdins.iter_mut().for_each(|s| *s = None);
        let deadline = Instant::now() + patience;
        self.procs
            .iter_mut()
            .map(|p| {
                loop {
                    match p.try_wait() {
                        Ok(Some(status)) => break Some(status),
                        Ok(None) if Instant::now() < deadline => {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        _ => break None,
                    }
                }
            })
            .collect()
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        self.stdins.iter_mut().for_each(|s| *s = None);
        for p in &mut self.procs {
            if matches!(p.try_wait(), Ok(None)) {
                let _ = p.kill();
                let _ = p.wait();
            }
        }
    }
}

/// A child's line, or the end of its output.
type Line = (usize, Option<String>);

/// The next message of any child, or the end of its output (`None`).
async fn next(
    rx: &mut mpsc::UnboundedReceiver<Line>,
) -> Result<(usize, Option<ToParent>), BoxError> {
    let (i, line) = match tokio::time::timeout(PATIENCE, rx.recv()).await {
        Ok(Some(got)) => got,
        Ok(None) => return Err("every child's output closed".into()),
        Err(_) => return Err(format!("no word from the children for {PATIENCE:?}").into()),
    };
    let Some(line) = line else {
        return Ok((i, None));
    };
    let message =
        serde_json::from_str(&line).map_err(|e| format!("child {i} wrote {line:?}: {e}"))?;
    Ok((i, Some(message)))
}

fn early(i: usize) -> BoxError {
    format!("child {i} exited before it reported").into()
}

/// The parent's side of a `--processes N` run: spawns the children, starts them together,
/// waits until they settled `target` rows, stops them, and merges their reports into `stats`.
pub(crate) async fn run_children(
    config: &Config,
    stats: &Stats,
    target: u64,
) -> Result<Children, BoxError> {
    let exe = std::env::current_exe()?;
    let n = config.processes;
    let (tx, mut rx) = mpsc::unbounded_channel::<Line>();
    let mut procs = Procs {
        procs: Vec::new(),
        stdins: Vec::new(),
    };
    for i in 0..n {
        let mut child = Command::new(&exe)
            .args(&config.args)
            .env(CHILD_ENV, i.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("could not start child {i} ({}): {e}", exe.display()))?;
        let stdout = child.stdout.take().ok_or("a child without its output")?;
        procs.stdins.push(child.stdin.take());
        procs.procs.push(child);
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send((i, Some(line))).is_err() {
                    return;
                }
            }
            let _ = tx.send((i, None));
        });
    }
    drop(tx);
    let mut ready = 0;
    while ready < n {
        match next(&mut rx).await? {
            (_, Some(ToParent::Ready)) => ready += 1,
            (i, None) => return Err(early(i)),
            (i, Some(other)) => {
                return Err(format!("child {i} wrote {other:?} before it was ready").into());
            }
        }
    }
    let start_us = now_us();
    procs.tell("go");
    let mut settled = vec![0u64; n];
    let mut last_progress = Instant::now();
    while settled.iter().sum::<u64>() < target {
        if last_progress.elapsed() > PATIENCE {
            return Err(format!(
                "no settlement for {PATIENCE:?}: {} of {target} settled ({settled:?})",
                settled.iter().sum::<u64>()
            )
            .into());
        }
        match next(&mut rx).await? {
            (i, Some(ToParent::Progress { settled: now })) => {
                stats.progressed(now.saturating_sub(settled[i]));
                settled[i] = now;
                last_progress = Instant::now();
            }
            (i, None) => return Err(early(i)),
            (i, Some(other)) => {
                return Err(format!("child {i} wrote {other:?} during the run").into());
            }
        }
    }
    procs.tell("stop");
    let mut reports: Vec<Option<Report>> = (0..n).map(|_| None).collect();
    while reports.iter().any(Option::is_none) {
        match next(&mut rx).await? {
            (_, Some(ToParent::Progress { .. })) => {}
            (i, Some(ToParent::Done { report })) => reports[i] = Some(*report),
            (i, None) if reports[i].is_some() => {}
            (i, None) => return Err(early(i)),
            (i, Some(other)) => {
                return Err(format!("child {i} wrote {other:?} at the end").into());
            }
        }
    }
    for (i, status) in procs.close(PATIENCE).into_iter().enumerate() {
        match status {
            Some(status) if status.success() => {}
            Some(status) => return Err(format!("child {i} exited with {status}").into()),
            None => return Err(format!("child {i} did not exit within {PATIENCE:?}").into()),
        }
    }
    let mut per_process_jobs = Vec::with_capacity(n);
    let mut peak_memory_kib = None;
    let mut last_us = start_us;
    for report in reports.into_iter().flatten() {
        per_process_jobs.push(report.settled);
        peak_memory_kib = peak_memory_kib.max(report.peak_memory_kib);
        last_us = last_us.max(report.last_settled_us);
        stats.absorb(report);
    }
    Ok(Children {
        elapsed: Duration::from_micros((last_us - start_us).max(0) as u64),
        per_process_jobs,
        peak_memory_kib,
    })
}

/// A session of the bench's own that holds the advisory locks of the held keys.
pub(crate) enum Holder {
    /// PostgreSQL.
    Pg(sqlx::PgConnection),
    /// MySQL/MariaDB.
    My(sqlx::MySqlConnection),
}

fn locked(rows: &[Vec<Value>]) -> bool {
    rows.first()
        .and_then(|r| r.first())
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

impl Holder {
    /// Takes the locks of `config`'s held keys (none: `None`). Fails if another session holds
    /// one of them.
    pub(crate) async fn hold(config: &Config) -> Result<Option<Self>, BoxError> {
        let keys = config.held_key_names();
        if keys.is_empty() {
            return Ok(None);
        }
        let holder = match &config.database {
            Database::Postgres(url) => {
                let mut conn = sqlx::PgConnection::connect(url).await?;
                for key in &keys {
                    let sql = "SELECT pg_try_advisory_lock($1) AS locked";
                    let rows = conn
                        .query(sql, vec![Value::Int(postgres_key_hash(key))], &["locked"])
                        .await?;
                    if !locked(&rows) {
                        return Err(format!("key {key} is held by another session").into());
                    }
                }
                Holder::Pg(conn)
            }
            Database::MySql(url) => {
                let mut conn = sqlx::MySqlConnection::connect(url).await?;
                let rows = conn
                    .query("SELECT DATABASE() AS db", Vec::new(), &["db"])
                    .await?;
                let database = match rows.first().and_then(|r| r.first()) {
                    Some(Value::Text(name)) => name.clone(),
                    _ => return Err("the connection names no database".into()),
                };
                for key in &keys {
                    let name = mysql_lock_name(&database, key);
                    let rows = conn
                        .query(
                            "SELECT GET_LOCK(?, 0) AS locked",
                            vec![Value::Text(name)],
                            &["locked"],
                        )
                        .await?;
                    if !locked(&rows) {
                        return Err(format!("key {key} is held by another session").into());
                    }
                }
                Holder::My(conn)
            }
            Database::Sqlite(_) => return Err("SQLite has no session locks to hold".into()),
        };
        Ok(Some(holder))
    }

    /// Releases the locks and closes the session.
    pub(crate) async fn release(self) -> Result<(), BoxError> {
        match self {
            Holder::Pg(mut conn) => {
                conn.execute("SELECT pg_advisory_unlock_all()", Vec::new())
                    .await?;
                conn.close().await?;
            }
            Holder::My(mut conn) => {
                conn.execute("SELECT RELEASE_ALL_LOCKS()", Vec::new())
                    .await?;
                conn.close().await?;
            }
        }
        Ok(())
    }
}
