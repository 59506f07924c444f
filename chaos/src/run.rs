//! The parent: one run per scenario × adapter × form, each in a database of its own, each
//! printing one result line.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

use crate::check::{self, Fault, FaultKind, Input, Report};
use crate::child::now_us;
use crate::cluster::Cluster;
use crate::db::{RunDb, Server};
use crate::plan::Mode;
use crate::rows::LOG;
use crate::{BoxError, Form, RunArgs, Scenario, Target};

/// How long a service may take to exit after SIGTERM: its shutdown timeout and a margin.
const SHUTDOWN: Duration = Duration::from_secs(10);
const EXIT_WITHIN: Duration = Duration::from_secs(20);
/// How long the parent waits for the services' sessions to leave the server after they
/// exited.
const LEAVE_WITHIN: Duration = Duration::from_secs(10);
/// How long a service may take to start.
const START_WITHIN: Duration = Duration::from_secs(60);
/// clock_skew: how far the wall clocks of its processes are set off the machine's, in µs:
/// the first ahead, the second behind (and so on, in turn).
const SKEW_US: i64 = 45_000_000;
/// clock_skew: how far a child's clock, as the parent reads it, may be off the skew set.
const SKEW_TOLERANCE_US: i64 = 5_000_000;
/// libfaketime's library for multithreaded programs, as Debian's `libfaketime` installs it.
const FAKETIME_LIB: &str = "libfaketimeMT.so.1";

/// One process's settings.
#[derive(Clone, Copy, Debug)]
struct Slot {
    workers: usize,
    pool: usize,
    drain: usize,
    /// How far its wall clock is set off the machine's, in µs (0: not at all).
    skew_us: i64,
}

/// A service process the parent started.
struct Proc {
    spawn: i64,
    slot: usize,
    child: Child,
    /// Kept open: the child takes its close for its parent's end.
    _stdin: Option<ChildStdin>,
    pid: u32,
    lines: Arc<Mutex<Vec<String>>>,
    /// The child's `clock wall_us=N` line: its wall clock, and the parent's as it read the
    /// line.
    clock: Arc<Mutex<Option<(i64, i64)>>>,
    stderr: Arc<Mutex<String>>,
}

impl Proc {
    /// How far the child's wall clock is off the parent's, in µs, as its first line says
    /// (a little less than that, by the line's way through the pipe).
    fn skew_seen(&self) -> Option<i64> {
        lock(&self.clock).map(|(child, parent)| child - parent)
    }

    fn ready(&self) -> bool {
        lock(&self.lines).iter().any(|l| l == "ready")
    }

    fn closed(&self) -> Option<String> {
        lock(&self.lines)
            .iter()
            .find(|l| l.starts_with("closed "))
            .cloned()
    }

    fn stderr_tail(&self) -> String {
        let text = lock(&self.stderr);
        let tail: Vec<&str> = text.lines().rev().take(6).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The settings every process of a run shares.
struct Common {
    target: Target,
    form: Form,
    url: Box<dyn Fn(i64) -> String + Send + Sync>,
    log_url: String,
    log_table: String,
    mode: Mode,
    handler_ms: u64,
    lease_ms: u64,
    max_attempts: u32,
    /// libfaketime's library, where a process's clock is set off (clock_skew).
    faketime: Option<PathBuf>,
}

/// libfaketime's library for multithreaded programs: in Debian's multiarch directory
/// (`/usr/lib/x86_64-linux-gnu/faketime/` here), else where a build from source puts it.
fn faketime_lib() -> Result<PathBuf, BoxError> {
    let arch = std::env::consts::ARCH;
    let mut dirs = vec![PathBuf::from(format!("/usr/lib/{arch}-linux-gnu/faketime"))];
    // The multiarch triplets that differ from `{arch}-linux-gnu` (arm-linux-gnueabihf,
    // powerpc64le-linux-gnu, ..): this architecture's only.
    let mut others: Vec<PathBuf> = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with(arch) && name.contains("-linux-")
        })
        .map(|e| e.path().join("faketime"))
        .collect();
    others.sort();
    others.retain(|d| *d != dirs[0]);
    dirs.extend(others);
    dirs.extend(
        [
            "/usr/lib/faketime",
            "/usr/lib64/faketime",
            "/usr/local/lib/faketime",
        ]
        .map(PathBuf::from),
    );
    dirs.iter()
        .map(|dir| dir.join(FAKETIME_LIB))
        .find(|lib| lib.is_file())
        .ok_or_else(|| {
            format!(
                "clock_skew needs libfaketime, which is not installed: no {FAKETIME_LIB} in {} \
                 (install the Debian package libfaketime: apt-get install libfaketime)",
                dirs.iter()
                    .map(|d| d.to_string_lossy())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
            .into()
        })
}

fn spawn_proc(common: &Common, spawn: i64, slot_no: usize, slot: Slot) -> Result<Proc, BoxError> {
    let exe = std::env::current_exe()?;
    let mut command = Command::new(exe);
    if slot.skew_us != 0 {
        // The wall clock set off by the skew; the monotonic clock (the timers, the pools'
        // timeouts) left as it is.
        let lib = common
            .faketime
            .as_ref()
            .ok_or("a clock skew without libfaketime")?;
        let preload = match std::env::var_os("LD_PRELOAD") {
            Some(before) if !before.is_empty() => {
                let mut both = lib.clone().into_os_string();
                both.push(":");
                both.push(before);
                both
            }
            _ => lib.clone().into_os_string(),
        };
        command
            .env("LD_PRELOAD", preload)
            .env("FAKETIME", faketime_spec(slot.skew_us))
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    }
    let mut child = command
        .arg("child")
        .args(["--target", common.target.name()])
        .args(["--form", common.form.name()])
        .args(["--url", &(common.url)(spawn)])
        .args(["--log-url", &common.log_url])
        .args(["--log-table", &common.log_table])
        .args(["--spawn", &spawn.to_string()])
        .args(["--workers", &slot.workers.to_string()])
        .args(["--pool", &slot.pool.to_string()])
        .args(["--drain", &slot.drain.to_string()])
        // The child brings the times it records back to the machine's clock.
        .arg(format!("--clock-offset-us={}", slot.skew_us))
        .args([
            "--mode",
            match common.mode {
                Mode::Normal => "normal",
                Mode::Storm => "storm",
            },
        ])
        .args(["--handler-ms", &common.handler_ms.to_string()])
        .args(["--lease-ms", &common.lease_ms.to_string()])
        .args(["--max-attempts", &common.max_attempts.to_string()])
        .args(["--shutdown-ms", &SHUTDOWN.as_millis().to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().ok_or("the child has no pid")?;
    let lines = Arc::new(Mutex::new(Vec::new()));
    let clock = Arc::new(Mutex::new(None));
    let stderr = Arc::new(Mutex::new(String::new()));
    if let Some(out) = child.stdout.take() {
        let lines = lines.clone();
        let clock = clock.clone();
        tokio::spawn(async move {
            let mut reader = BufReader::new(out).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                let read_us = now_us();
                if let Some(wall) = line
                    .strip_prefix("clock wall_us=")
                    .and_then(|v| v.parse::<i64>().ok())
                {
                    lock(&clock).get_or_insert((wall, read_us));
                }
                lock(&lines).push(line);
            }
        });
    }
    if let Some(mut err) = child.stderr.take() {
        let stderr = stderr.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let mut text = lock(&stderr);
                text.push_str(&String::from_utf8_lossy(&buf[..n]));
                // Keep the last 16 kB.
                if text.len() > 32 * 1024 {
                    let cut = text.len() - 16 * 1024;
                    let cut = (cut..text.len())
                        .find(|&i| text.is_char_boundary(i))
                        .unwrap_or(0);
                    text.drain(..cut);
                }
            }
        });
    }
    let stdin = child.stdin.take();
    Ok(Proc {
        spawn,
        slot: slot_no,
        child,
        _stdin: stdin,
        pid,
        lines,
        clock,
        stderr,
    })
}

/// libfaketime's `FAKETIME` of a skew: `+45s`, `-45s` (whole seconds; µs otherwise).
fn faketime_spec(skew_us: i64) -> String {
    if skew_us % 1_000_000 == 0 {
        format!("{:+}s", skew_us / 1_000_000)
    } else {
        format!("{:+.6}s", skew_us as f64 / 1e6)
    }
}

/// What a run found.
struct Outcome {
    line: String,
    failed: bool,
    details: Vec<String>,
}

/// The whole invocation: every run, one line each; a last line with the totals.
pub async fn main(args: RunArgs) -> ExitCode {
    let seed = args.seed.unwrap_or_else(|| now_us() as u64);
    let mut cluster: Option<Cluster> = None;
    let (mut runs, mut failed) = (0usize, 0usize);
    let mut n = 0u64;
    for (scenario, target, form) in plan_runs(&args) {
        n += 1;
        let run_seed = seed.wrapping_add(n);
        let outcome = match run_one(&args, scenario, target, form, run_seed, n, &mut cluster).await
        {
            Ok(outcome) => outcome,
            Err(error) => Outcome {
                line: format!(
                    "chaos scenario={} adapter={} db={} form={} seed={run_seed} \
                     verdict=ERROR {error}",
                    scenario.name(),
                    target.adapter(),
                    if target.postgres() {
                        "postgres"
                    } else {
                        "mysql"
                    },
                    form.name()
                ),
                failed: true,
                details: Vec::new(),
            },
        };
        println!("{}", outcome.line);
        for detail in outcome.details.iter().take(30) {
            eprintln!("    {detail}");
        }
        runs += 1;
        failed += usize::from(outcome.failed);
    }
    if let Some(cluster) = cluster {
        cluster.stop().await;
    }
    println!("chaos: {runs} runs, {failed} failed (seed {seed})");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The runs of the invocation: every scenario × adapter × form asked for (db_restart on the
/// PostgreSQL adapters only), or with `--rotate` each scenario × form once, the adapters in
/// turn.
fn plan_runs(args: &RunArgs) -> Vec<(Scenario, Target, Form)> {
    let mut runs = Vec::new();
    let mut turn = args.rotate.unwrap_or(0);
    for &scenario in &args.scenario {
        let targets: Vec<Target> = args
            .adapter
            .iter()
            .copied()
            .filter(|t| scenario != Scenario::DbRestart || t.postgres())
            .collect();
        if targets.len() < args.adapter.len() {
            eprintln!(
                "ruststream-chaos: db_restart runs on PostgreSQL only (a throwaway server it \
                 restarts)"
            );
        }
        if targets.is_empty() {
            continue;
        }
        for &form in &args.form {
            if args.rotate.is_some() {
                runs.push((scenario, targets[turn % targets.len()], form));
                turn += 1;
            } else {
                runs.extend(targets.iter().map(|&t| (scenario, t, form)));
            }
        }
    }
    runs
}

/// The processes of a scenario.
fn slots(args: &RunArgs, scenario: Scenario) -> Vec<Slot> {
    let processes = args.processes.unwrap_or(match scenario {
        Scenario::RepeatedKills => 3,
        _ => 2,
    });
    let workers = args.workers.unwrap_or(match scenario {
        Scenario::PoolExhaustion | Scenario::RetryStorm => 6,
        _ => 4,
    });
    (0..processes.max(1))
        .map(|i| match scenario {
            // Even processes: a pool of 2 for all the workers; odd ones: a pool of the
            // workers' size that other users hold 4 connections of, on and off.
            Scenario::PoolExhaustion if i % 2 == 0 => Slot {
                workers,
                pool: 2,
                drain: 0,
                skew_us: 0,
            },
            Scenario::PoolExhaustion => Slot {
                workers,
                pool: workers,
                drain: 4.min(workers.saturating_sub(1)),
                skew_us: 0,
            },
            // Ahead, behind, ahead, ..
            Scenario::ClockSkew => Slot {
                workers,
                pool: workers + 2,
                drain: 0,
                skew_us: if i % 2 == 0 { SKEW_US } else { -SKEW_US },
            },
            _ => Slot {
                workers,
                pool: workers + 2,
                drain: 0,
                skew_us: 0,
            },
        })
        .collect()
}

/// The faults and what they did to the processes.
#[derive(Default)]
struct Faults {
    list: Vec<Fault>,
    /// Processes that ended without a graceful shutdown, and when.
    ended: HashMap<i64, i64>,
    kills: usize,
    session_kills: usize,
    restarts: usize,
    /// clock_skew: how far each process's wall clock was off the parent's as it started, in
    /// µs, as the parent saw it (none: it did not say).
    skews_seen: Vec<Option<i64>>,
}

async fn run_one(
    args: &RunArgs,
    scenario: Scenario,
    target: Target,
    form: Form,
    seed: u64,
    n: u64,
    cluster: &mut Option<Cluster>,
) -> Result<Outcome, BoxError> {
    let server = if scenario == Scenario::DbRestart {
        if cluster.is_none() {
            *cluster = Some(Cluster::start(args.pg_bin.as_deref()).await?);
        }
        Server::new(&cluster.as_ref().expect("started above").url())?
    } else if target.postgres() {
        Server::new(&args.pg_url)?
    } else {
        Server::new(&args.mysql_url)?
    };
    let tag = format!("chaos_{}_{n}", std::process::id());
    server.create_db(&tag).await?;
    let db = RunDb::connect(&server, &tag, &format!("{tag}-parent")).await?;
    let result = drive(args, scenario, target, form, seed, &server, &db, &*cluster).await;
    db.close().await;
    let keep = args.keep_failed && result.as_ref().map_or(true, |o| o.failed);
    if keep {
        eprintln!("ruststream-chaos: kept the database {tag} of the failed run");
    } else if let Err(error) = server.drop_db(&tag).await {
        eprintln!("ruststream-chaos: dropping the database {tag}: {error}");
    }
    result
}

#[allow(clippy::too_many_arguments)]
async fn drive(
    args: &RunArgs,
    scenario: Scenario,
    target: Target,
    form: Form,
    seed: u64,
    server: &Server,
    db: &RunDb,
    cluster: &Option<Cluster>,
) -> Result<Outcome, BoxError> {
    let tag = db.name.clone();
    let slots = slots(args, scenario);
    let faketime = if slots.iter().any(|s| s.skew_us != 0) {
        // The skew must be longer than a lease: a process that judged leases by its own clock,
        // ahead by more than a lease, would take rows another still holds; with a longer
        // lease it would not, and the scenario would prove nothing of the leases.
        if args.lease_ms.saturating_mul(1000) >= SKEW_US.unsigned_abs() {
            return Err(format!(
                "clock_skew sets clocks {}s off: --lease-ms {} must be shorter",
                SKEW_US / 1_000_000,
                args.lease_ms
            )
            .into());
        }
        Some(faketime_lib()?)
    } else {
        None
    };
    let database = db_label(db).await;
    db.create_tables(form == Form::Lease).await?;
    db.publish(args.jobs, args.keys).await?;
    let jobs = db.jobs().await?;
    let total = jobs.len() as i64;

    let held = if scenario == Scenario::IdleInTx {
        Some(db.hold_transaction().await?)
    } else {
        None
    };

    let url_server = server.clone();
    let url_tag = tag.clone();
    let common = Common {
        target,
        form,
        url: Box::new(move |spawn| {
            url_server.url(Some(&url_tag), Some(&format!("{url_tag}-b{spawn}")))
        }),
        log_url: if server.postgres {
            server.url(Some(&tag), Some(&format!("{tag}-log")))
        } else {
            // No default database: the services' sessions are those whose database is the
            // run's (backend_kill kills those, the check looks for those).
            server.url(None, None)
        },
        log_table: db.table(LOG),
        mode: if scenario == Scenario::RetryStorm {
            Mode::Storm
        } else {
            Mode::Normal
        },
        handler_ms: args.handler_ms,
        lease_ms: args.lease_ms,
        max_attempts: args.max_attempts,
        faketime,
    };
    let mut violations: Vec<String> = Vec::new();
    let mut faults = Faults::default();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut next_spawn = 1i64;

    let start_us = now_us();
    let started = Instant::now();
    let mut procs: Vec<Proc> = Vec::new();
    for (i, slot) in slots.iter().enumerate() {
        procs.push(spawn_proc(&common, next_spawn, i, *slot)?);
        next_spawn += 1;
    }
    // Every service starts (bounded) before the faults begin.
    let ready_by = Instant::now() + START_WITHIN;
    while !procs.iter().all(Proc::ready) {
        if Instant::now() > ready_by {
            violations.push(format!("a service did not start within {START_WITHIN:?}"));
            break;
        }
        let gone = (0..procs.len()).find(|&i| !procs[i].ready() && exited(&mut procs[i].child));
        if let Some(i) = gone {
            let p = &procs[i];
            tokio::time::sleep(Duration::from_millis(200)).await;
            return Err(format!("spawn {} did not start: {}", p.spawn, p.stderr_tail()).into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // clock_skew: each process's wall clock is off by its skew, else the run proves nothing.
    for p in procs.iter().filter(|p| slots[p.slot].skew_us != 0) {
        let want = slots[p.slot].skew_us;
        let seen = p.skew_seen();
        faults.skews_seen.push(seen);
        match seen {
            Some(seen) if (seen - want).abs() <= SKEW_TOLERANCE_US => {}
            Some(seen) => violations.push(format!(
                "spawn {}: its wall clock is {:+.3}s off the machine's, not the {} set through \
                 libfaketime: the skew is not in effect",
                p.spawn,
                seen as f64 / 1e6,
                faketime_spec(want)
            )),
            None => violations.push(format!(
                "spawn {}: it did not report its wall clock (the skew cannot be checked)",
                p.spawn
            )),
        }
    }

    // The faults, until the table is drained or the bound passes.
    let deadline = started + args.bound();
    let kill_every = Duration::from_millis(args.kill_every_ms.max(50));
    let session_every = Duration::from_millis(args.session_kill_every_ms.max(10));
    let mut next_kill = Instant::now() + kill_every;
    let mut next_session_kill = Instant::now() + session_every;
    let mut last_look = Instant::now() - Duration::from_secs(1);
    let mut pending = total;
    let mut last_restart = Instant::now();
    // A count of the rows left: ten a second on a small table, one every two seconds on a
    // large one (a count of a million rows takes a while).
    let look_every = if total <= 10_000 {
        Duration::from_millis(100)
    } else {
        Duration::from_secs(2)
    };
    let drained_at;
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = Instant::now();
        // A service that died on its own.
        for proc in &mut procs {
            if exited(&mut proc.child) {
                let p = &*proc;
                violations.push(format!(
                    "spawn {} (pid {}) exited on its own: {}",
                    p.spawn,
                    p.pid,
                    p.stderr_tail()
                ));
                faults.ended.insert(p.spawn, now_us());
                let slot = p.slot;
                *proc = spawn_proc(&common, next_spawn, slot, slots[slot])?;
                next_spawn += 1;
            }
        }
        if now.duration_since(last_look) >= look_every {
            last_look = now;
            if let Ok(p) = db.pending().await {
                pending = p;
            }
            if pending == 0 {
                drained_at = Instant::now();
                break;
            }
        }
        if now > deadline {
            violations.push(format!(
                "not drained within {}s: {pending} of {total} rows neither acknowledged nor failed",
                args.seconds
            ));
            drained_at = Instant::now();
            break;
        }
        match scenario {
            Scenario::RepeatedKills if now >= next_kill => {
                next_kill += kill_every;
                let i = rng.usize(..procs.len());
                let from_us = now_us();
                let _ = procs[i].child.start_kill();
                let _ = procs[i].child.wait().await;
                let to_us = now_us();
                // SIGKILL ends the process as it arrives: what it held is gone from then on
                // (the server lets it go a moment later, when it sees the socket close).
                faults.ended.insert(procs[i].spawn, from_us);
                faults.list.push(Fault {
                    from_us,
                    to_us,
                    kind: FaultKind::Kill,
                    spawn: Some(procs[i].spawn),
                });
                faults.kills += 1;
                let slot = procs[i].slot;
                procs[i] = spawn_proc(&common, next_spawn, slot, slots[slot])?;
                next_spawn += 1;
            }
            Scenario::BackendKill if now >= next_session_kill => {
                next_session_kill += session_every;
                let sessions = match db.broker_sessions(&format!("{tag}-b")).await {
                    Ok(sessions) => sessions,
                    Err(error) => {
                        violations.push(format!("the parent cannot list the sessions: {error}"));
                        Vec::new()
                    }
                };
                if !sessions.is_empty() {
                    let victim = sessions[rng.usize(..sessions.len())];
                    let spawn = victim.spawn.or_else(|| {
                        let port = victim.port?;
                        procs
                            .iter()
                            .find(|p| local_ports(p.pid).contains(&port))
                            .map(|p| p.spawn)
                    });
                    let from_us = now_us();
                    if let Ok(true) = db.kill_session(victim.id).await {
                        faults.list.push(Fault {
                            from_us,
                            to_us: now_us(),
                            kind: FaultKind::SessionKill,
                            spawn,
                        });
                        faults.session_kills += 1;
                    }
                }
            }
            Scenario::DbRestart if faults.restarts < 2 => {
                // Restart at a quarter and at three fifths of the rows, a second apart at
                // least.
                let done = 1.0 - pending as f64 / total.max(1) as f64;
                let due = if faults.restarts == 0 { 0.25 } else { 0.6 };
                if done >= due && now.duration_since(last_restart) >= Duration::from_secs(1) {
                    let cluster = cluster.as_ref().ok_or("db_restart without its server")?;
                    let from_us = now_us();
                    cluster.restart().await?;
                    faults.list.push(Fault {
                        from_us,
                        to_us: now_us(),
                        kind: FaultKind::Restart,
                        spawn: None,
                    });
                    faults.restarts += 1;
                    last_restart = Instant::now();
                }
            }
            _ => {}
        }
    }
    let elapsed = drained_at.duration_since(started);
    if scenario == Scenario::DbRestart && faults.restarts < 2 {
        violations.push(format!(
            "the run drained after {} restart(s) of 2: raise --jobs or --handler-ms",
            faults.restarts
        ));
    }

    // Stop every service with SIGTERM; each must exit in time, and with success.
    for p in &procs {
        let _ = kill(Pid::from_raw(p.pid as i32), Signal::SIGTERM);
    }
    let mut closed = (0usize, 0usize);
    for p in &mut procs {
        match tokio::time::timeout(EXIT_WITHIN, p.child.wait()).await {
            Ok(Ok(status)) if status.success() => {}
            Ok(Ok(status)) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                violations.push(format!(
                    "spawn {} exited with {status} after SIGTERM: {}",
                    p.spawn,
                    p.stderr_tail()
                ));
                faults.ended.insert(p.spawn, now_us());
            }
            Ok(Err(error)) => return Err(error.into()),
            Err(_) => {
                violations.push(format!(
                    "spawn {} did not exit within {EXIT_WITHIN:?} of SIGTERM",
                    p.spawn
                ));
                let _ = p.child.start_kill();
                let _ = p.child.wait().await;
                faults.ended.insert(p.spawn, now_us());
            }
        }
        if let Some(line) = p.closed() {
            let count = |name: &str| {
                line.split_whitespace()
                    .find_map(|w| w.strip_prefix(name))
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap_or(0)
            };
            closed.0 += count("locks_released=");
            closed.1 += count("connections_closed=");
        }
    }
    if let Some(held) = held {
        held.end().await;
    }

    // Nothing of the services' may stay on the server.
    let leave_by = Instant::now() + LEAVE_WITHIN;
    loop {
        let left = db.leftovers(args.keys).await?;
        if left.is_empty() {
            break;
        }
        if Instant::now() > leave_by {
            violations.extend(left.into_iter().map(|l| {
                format!("left on the server {LEAVE_WITHIN:?} after the services exited: {l}")
            }));
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // What the handlers recorded against what the table holds.
    let log = db.log().await?;
    let remaining = db.remaining().await?;
    faults.list.sort_by_key(|f| f.from_us);
    let report = check::check(&Input {
        jobs: &jobs,
        remaining: &remaining,
        log: &log,
        ended: &faults.ended,
        faults: &faults.list,
        form,
        max_attempts: i64::from(args.max_attempts),
        lease_us: args.lease_ms as i64 * 1000,
        start_us,
        retry_delay_us: common.mode.retry_delay().as_micros() as i64,
    });
    violations.extend(report.violations.iter().cloned());
    Ok(line(
        scenario, target, form, &database, &slots, &faults, elapsed, total, seed, &report, closed,
        violations,
    ))
}

/// The local TCP ports of process `pid`'s sockets (Linux: its descriptors' socket inodes,
/// found in /proc/net/tcp and tcp6); empty elsewhere.
fn local_ports(pid: u32) -> HashSet<u16> {
    let inodes: HashSet<u64> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|target| {
            let text = target.to_string_lossy().into_owned();
            text.strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect();
    let mut ports = HashSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(inode)) = (fields.get(1), fields.get(9)) else {
                continue;
            };
            if inode.parse::<u64>().is_ok_and(|i| inodes.contains(&i))
                && let Some(port) = local
                    .rsplit_once(':')
                    .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
            {
                ports.insert(port);
            }
        }
    }
    ports
}

fn exited(child: &mut Child) -> bool {
    matches!(child.try_wait(), Ok(Some(_)))
}

async fn db_label(db: &RunDb) -> String {
    if db.server.postgres {
        return "postgres".to_owned();
    }
    // MariaDB stands in for MySQL here; say which answered.
    match db.version().await {
        Ok(v) if v.to_lowercase().contains("mariadb") => "mariadb".to_owned(),
        _ => "mysql".to_owned(),
    }
}

#[allow(clippy::too_many_arguments)]
fn line(
    scenario: Scenario,
    target: Target,
    form: Form,
    database: &str,
    slots: &[Slot],
    faults: &Faults,
    elapsed: Duration,
    total: i64,
    seed: u64,
    report: &Report,
    closed: (usize, usize),
    violations: Vec<String>,
) -> Outcome {
    let fault_text = match scenario {
        Scenario::RepeatedKills => format!("kills={}", faults.kills),
        Scenario::BackendKill => format!("session_kills={}", faults.session_kills),
        Scenario::DbRestart => format!("restarts={}", faults.restarts),
        Scenario::PoolExhaustion => {
            let pools: Vec<String> = slots
                .iter()
                .map(|s| {
                    if s.drain > 0 {
                        format!("{}/{}-{}held", s.workers, s.pool, s.drain)
                    } else {
                        format!("{}/{}", s.workers, s.pool)
                    }
                })
                .collect();
            format!("workers/pool={}", pools.join(","))
        }
        Scenario::RetryStorm => "retry=immediate".to_owned(),
        Scenario::IdleInTx => "held_tx=1".to_owned(),
        Scenario::ClockSkew => {
            let set: Vec<String> = slots.iter().map(|s| faketime_spec(s.skew_us)).collect();
            let seen: Vec<String> = faults
                .skews_seen
                .iter()
                .map(|s| s.map_or("none".to_owned(), |s| format!("{:+.2}s", s as f64 / 1e6)))
                .collect();
            format!("skew={} skew_seen={}", set.join(","), seen.join(","))
        }
    };
    let secs = elapsed.as_secs_f64();
    let verdict = if violations.is_empty() {
        "ok".to_owned()
    } else {
        let first: Vec<&str> = violations.iter().take(3).map(String::as_str).collect();
        format!("FAIL violations={}: {}", violations.len(), first.join("; "))
    };
    let line = format!(
        "chaos scenario={} adapter={} db={database} form={} jobs={total} processes={} \
         workers={} {fault_text} elapsed={secs:.1}s jobs/s={:.0} deliveries={} acked={} \
         rejected={} exhausted={} spent_by_faults={} excused_overlaps={} \
         shutdown_locks_released={} shutdown_conns_closed={} seed={seed} verdict={verdict}",
        scenario.name(),
        target.adapter(),
        form.name(),
        slots.len(),
        slots.first().map_or(0, |s| s.workers),
        total as f64 / secs.max(0.001),
        report.deliveries,
        report.acked,
        report.rejected,
        report.exhausted,
        report.spent,
        report.excused.len(),
        closed.0,
        closed.1,
    );
    let mut details = violations.clone();
    details.extend(
        report
            .excused
            .iter()
            .take(3)
            .map(|e| format!("excused: {e}")),
    );
    Outcome {
        line,
        failed: !violations.is_empty(),
        details,
    }
}
