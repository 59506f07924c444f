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

use crate::bouncer::Bouncer;
use crate::check::{self, Fault, FaultKind, Input, Poison, Report};
use crate::child::now_us;
use crate::cluster::Cluster;
use crate::db::{RunDb, Server};
use crate::gate::Gate;
use crate::plan::Mode;
use crate::rows::{LOG, poisoned};
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
/// poison_rows: how long the run goes on once the other rows settled, so the poison rows are
/// taken again a few times.
const POISON_HOLD: Duration = Duration::from_secs(2);
/// failed_start: when the late process's port opens, after the first service started.
const LATE_AFTER: Duration = Duration::from_millis(2500);
/// failed_start: how long the late process may take to start once its port is open (its
/// retries wait 1, 2, 4 s ..).
const LATE_WITHIN: Duration = Duration::from_secs(20);
/// What a service prints while its start fails and is tried again.
const START_REPORT: &str = "cannot start";
/// What a service behind transaction pooling that holds session locks must answer.
const POOLING_REFUSAL: &str = "transaction pooling";

/// One process's settings.
#[derive(Clone, Copy, Debug)]
struct Slot {
    workers: usize,
    pool: usize,
    drain: usize,
    /// How far its wall clock is set off the machine's, in µs (0: not at all).
    skew_us: i64,
    /// failed_start: the port of the gate it reaches the server through (run as a service).
    gate: Option<u16>,
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
    /// poison_rows: the table is bare.
    bare: bool,
    /// pooler: the direct URL of the listening session.
    listen_url: Option<String>,
    /// failed_start: the URL through a gate's port, for a spawn.
    via: Box<dyn Fn(u16, i64) -> String + Send + Sync>,
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
    let mut extra: Vec<String> = Vec::new();
    if common.bare {
        extra.push("--bare".into());
    }
    if let Some(url) = &common.listen_url {
        extra.extend(["--listen-url".into(), url.clone()]);
    }
    let url = match slot.gate {
        Some(port) => {
            extra.push("--app".into());
            (common.via)(port, spawn)
        }
        None => (common.url)(spawn),
    };
    let mut child = command
        .arg("child")
        .args(["--target", common.target.name()])
        .args(["--form", common.form.name()])
        .args(["--url", &url])
        .args(["--log-url", &common.log_url])
        .args(["--log-table", &common.log_table])
        .args(["--spawn", &spawn.to_string()])
        .args(["--workers", &slot.workers.to_string()])
        .args(["--pool", &slot.pool.to_string()])
        .args(["--drain", &slot.drain.to_string()])
        // The child brings the times it records back to the machine's clock.
        .arg(format!("--clock-offset-us={}", slot.skew_us))
        .args(["--mode", common.mode.name()])
        .args(["--handler-ms", &common.handler_ms.to_string()])
        .args(["--lease-ms", &common.lease_ms.to_string()])
        .args(["--max-attempts", &common.max_attempts.to_string()])
        .args(["--shutdown-ms", &SHUTDOWN.as_millis().to_string()])
        .args(&extra)
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
            .filter(|t| !scenario.postgres_only() || t.postgres())
            .collect();
        if targets.len() < args.adapter.len() {
            eprintln!(
                "ruststream-chaos: {} runs on PostgreSQL only (a throwaway server it restarts, \
                 a pooler of PostgreSQL's)",
                scenario.name()
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

/// The processes of a scenario; failed_start's two more reach the server through `gates`.
fn slots(args: &RunArgs, scenario: Scenario, gates: &[u16]) -> Vec<Slot> {
    let mut slots = service_slots(args, scenario);
    let workers = slots.first().map_or(4, |s| s.workers);
    slots.extend(gates.iter().map(|&port| Slot {
        workers,
        pool: workers + 2,
        drain: 0,
        skew_us: 0,
        gate: Some(port),
    }));
    slots
}

/// The processes of a scenario that reach the server directly.
fn service_slots(args: &RunArgs, scenario: Scenario) -> Vec<Slot> {
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
                gate: None,
            },
            Scenario::PoolExhaustion => Slot {
                workers,
                pool: workers,
                drain: 4.min(workers.saturating_sub(1)),
                skew_us: 0,
                gate: None,
            },
            // Ahead, behind, ahead, ..
            Scenario::ClockSkew => Slot {
                workers,
                pool: workers + 2,
                drain: 0,
                skew_us: if i % 2 == 0 { SKEW_US } else { -SKEW_US },
                gate: None,
            },
            _ => Slot {
                workers,
                pool: workers + 2,
                drain: 0,
                skew_us: 0,
                gate: None,
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
    /// What the scenario's own checks saw, for the result line (poison_rows, failed_start).
    notes: Vec<String>,
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
    // failed_start's gates: one that stays shut, one that opens a few seconds in.
    let (shut_gate, mut late_gate) = if scenario == Scenario::FailedStart {
        (Some(Gate::shut()?), Some(Gate::shut()?))
    } else {
        (None, None)
    };
    let gate_ports: Vec<u16> = shut_gate.iter().chain(&late_gate).map(Gate::port).collect();
    let slots = slots(args, scenario, &gate_ports);
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
    // poison_rows: ten times the jobs, handlers twenty times quicker, on the bare table.
    let bare = scenario == Scenario::PoisonRows;
    let (job_count, handler_ms) = if bare {
        (args.jobs * 10, args.handler_ms / 20)
    } else {
        (args.jobs, args.handler_ms)
    };
    db.create_tables(form == Form::Lease, bare).await?;
    db.publish(job_count, args.keys).await?;
    if bare {
        db.poison().await?;
    }
    let jobs = db.jobs().await?;
    let poison: HashSet<i64> = jobs
        .iter()
        .map(|&(id, _)| id)
        .filter(|&id| bare && poisoned(id))
        .collect();
    let total = (jobs.len() - poison.len()) as i64;
    let bouncer = if scenario == Scenario::Pooler {
        let (host, port) = server.addr();
        Some(Bouncer::start(&host, port, &server.user(), &tag).await?)
    } else {
        None
    };

    let held = if scenario == Scenario::IdleInTx {
        Some(db.hold_transaction().await?)
    } else {
        None
    };

    let url_server = server.clone();
    let url_tag = tag.clone();
    let pooler_port = bouncer.as_ref().map(Bouncer::port);
    let via_server = server.clone();
    let via_tag = tag.clone();
    let common = Common {
        target,
        form,
        url: Box::new(move |spawn| {
            let app = format!("{url_tag}-b{spawn}");
            match pooler_port {
                Some(port) => url_server.url_at(port, Some(&url_tag), Some(&app)),
                None => url_server.url(Some(&url_tag), Some(&app)),
            }
        }),
        via: Box::new(move |port, spawn| {
            via_server.url_at(port, Some(&via_tag), Some(&format!("{via_tag}-b{spawn}")))
        }),
        bare,
        listen_url: bouncer
            .as_ref()
            .map(|_| server.url(Some(&tag), Some(&format!("{tag}-listen")))),
        log_url: if server.postgres {
            server.url(Some(&tag), Some(&format!("{tag}-log")))
        } else {
            // No default database: the services' sessions are those whose database is the
            // run's (backend_kill kills those, the check looks for those).
            server.url(None, None)
        },
        log_table: db.table(LOG),
        mode: match scenario {
            Scenario::RetryStorm => Mode::Storm,
            Scenario::PoisonRows => Mode::Poison,
            _ => Mode::Normal,
        },
        handler_ms,
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
    // pooler, in the forms that hold session locks: every service refuses at the start.
    if form != Form::Lease
        && let Some(bouncer) = bouncer
    {
        let mut violations = pooler_refusals(&mut procs).await;
        bouncer.stop().await;
        violations.extend(leftover_violations(db, args.keys).await?);
        let faults = Faults {
            notes: vec![format!("pgbouncer=transaction refused={}", procs.len())],
            ..Faults::default()
        };
        let report = Report::default();
        let elapsed = started.elapsed();
        return Ok(line(
            scenario,
            target,
            form,
            &database,
            &slots,
            &faults,
            elapsed,
            total,
            seed,
            &report,
            (0, 0),
            violations,
        ));
    }
    // Every service starts (bounded) before the faults begin; failed_start's gated ones
    // cannot yet.
    let gated = |p: &Proc| slots[p.slot].gate.is_some();
    let ready_by = Instant::now() + START_WITHIN;
    while !procs.iter().all(|p| gated(p) || p.ready()) {
        if Instant::now() > ready_by {
            violations.push(format!("a service did not start within {START_WITHIN:?}"));
            break;
        }
        let gone = (0..procs.len())
            .find(|&i| !gated(&procs[i]) && !procs[i].ready() && exited(&mut procs[i].child));
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
        if let Some(gate) = late_gate.as_mut().filter(|g| !g.is_open())
            && now.duration_since(started) >= LATE_AFTER
        {
            let (host, port) = server.addr();
            gate.open(&host, port).await?;
        }
        if now.duration_since(last_look) >= look_every {
            last_look = now;
            if let Ok(p) = db.pending(bare).await {
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

    if bare {
        tokio::time::sleep(POISON_HOLD).await;
    }
    if let Some(gate) = late_gate.as_mut() {
        let late = procs
            .iter()
            .find(|p| slots[p.slot].gate == Some(gate.port()));
        violations.extend(late_started(gate, late, server).await?);
    }

    // poison_rows: how often each poison row was taken before the stop.
    let at_stop: HashMap<i64, i64> = if bare {
        let rows = db.remaining(bare).await?;
        rows.iter()
            .filter(|r| poison.contains(&r.id))
            .map(|r| (r.id, r.attempt))
            .collect()
    } else {
        HashMap::new()
    };
    // Stop every service with SIGTERM; each must exit in time, and with success.
    let stop_us = now_us();
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
    if let Some(gate) = &shut_gate {
        let shut = procs
            .iter()
            .find(|p| slots[p.slot].gate == Some(gate.port()));
        let (found, notes) = start_reports(shut);
        violations.extend(found);
        faults.notes.extend(notes);
    }
    // The pooler's server sessions go with it.
    if let Some(bouncer) = bouncer {
        bouncer.stop().await;
        faults.notes.push("pgbouncer=transaction".to_owned());
    }

    // Nothing of the services' may stay on the server.
    violations.extend(leftover_violations(db, args.keys).await?);

    // What the handlers recorded against what the table holds.
    let log = db.log().await?;
    let remaining = db.remaining(bare).await?;
    faults.list.sort_by_key(|f| f.from_us);
    // A poison row is taken at once, then again no sooner than its delay by each process.
    let delay_us = common.mode.retry_delay().as_micros() as i64;
    let most_takes = slots.len() as i64 * ((stop_us - start_us) / delay_us.max(1) + 1) + 1;
    let poison_bound = Poison {
        ids: &poison,
        most_takes,
        at_stop: &at_stop,
        in_flight: slots.len() as i64,
    };
    let report = check::check(&Input {
        jobs: &jobs,
        remaining: &remaining,
        log: &log,
        ended: &faults.ended,
        faults: &faults.list,
        form,
        // A table that keeps no failed rows has no attempt budget.
        max_attempts: if bare {
            i64::MAX
        } else {
            i64::from(args.max_attempts)
        },
        lease_us: args.lease_ms as i64 * 1000,
        start_us,
        retry_delay_us: delay_us,
        waits_in_process: bare && form != Form::Lease,
        poison: bare.then_some(poison_bound),
    });
    violations.extend(report.violations.iter().cloned());
    if let Some((rows, most)) = report.poison {
        faults.notes.push(format!(
            "poison_rows={rows} poison_takes_max={most} allowed={most_takes}"
        ));
    }
    Ok(line(
        scenario, target, form, &database, &slots, &faults, elapsed, total, seed, &report, closed,
        violations,
    ))
}

/// pooler, in the forms that hold session locks: each service must exit at its start, in
/// time, saying that transaction pooling is in the way.
async fn pooler_refusals(procs: &mut [Proc]) -> Vec<String> {
    let mut violations = Vec::new();
    for p in procs {
        match tokio::time::timeout(START_WITHIN, p.child.wait()).await {
            Ok(Ok(status)) if !status.success() => {
                // Its last words, through the pipe.
                tokio::time::sleep(Duration::from_millis(200)).await;
                let said = lock(&p.stderr).clone();
                if !said.contains(POOLING_REFUSAL) {
                    violations.push(format!(
                        "spawn {} refused to start, but not naming {POOLING_REFUSAL}: {}",
                        p.spawn,
                        p.stderr_tail()
                    ));
                }
            }
            Ok(Ok(status)) => violations.push(format!(
                "spawn {} ran behind transaction pooling ({status}); it holds session locks \
                 and must refuse at the start",
                p.spawn
            )),
            Ok(Err(error)) => violations.push(format!("spawn {}: {error}", p.spawn)),
            Err(_) => {
                violations.push(format!(
                    "spawn {} did not refuse transaction pooling within {START_WITHIN:?} (ready: \
                     {})",
                    p.spawn,
                    p.ready()
                ));
                let _ = p.child.start_kill();
                let _ = p.child.wait().await;
            }
        }
    }
    violations
}

/// What the services left on the server, once they had [`LEAVE_WITHIN`] to let it go.
async fn leftover_violations(db: &RunDb, keys: u64) -> Result<Vec<String>, BoxError> {
    let leave_by = Instant::now() + LEAVE_WITHIN;
    loop {
        let left = db.leftovers(keys).await?;
        if left.is_empty() {
            return Ok(Vec::new());
        }
        if Instant::now() > leave_by {
            return Ok(left
                .into_iter()
                .map(|l| {
                    format!("left on the server {LEAVE_WITHIN:?} after the services exited: {l}")
                })
                .collect());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// failed_start: the late process starts once its gate is open (opened here, where the run
/// drained first).
async fn late_started(
    gate: &mut Gate,
    late: Option<&Proc>,
    server: &Server,
) -> Result<Vec<String>, BoxError> {
    if !gate.is_open() {
        let (host, port) = server.addr();
        gate.open(&host, port).await?;
    }
    let Some(late) = late else {
        return Ok(vec!["failed_start: the late process is missing".to_owned()]);
    };
    let by = Instant::now() + LATE_WITHIN;
    while !late.ready() {
        if Instant::now() > by {
            return Ok(vec![format!(
                "spawn {}: its server came up, and it did not start within {LATE_WITHIN:?}: {}",
                late.spawn,
                late.stderr_tail()
            )]);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let reports = lock(&late.stderr).matches(START_REPORT).count();
    if reports == 0 {
        return Ok(vec![format!(
            "spawn {}: it started late without a word of the failed starts before",
            late.spawn
        )]);
    }
    Ok(Vec::new())
}

/// failed_start: the process whose start could not succeed said so at once and again as it
/// tried, naming the table, without a line a second (its retries wait 1, 2, 4 s ..).
fn start_reports(shut: Option<&Proc>) -> (Vec<String>, Vec<String>) {
    let Some(shut) = shut else {
        return (
            vec!["failed_start: the refused process is missing".to_owned()],
            Vec::new(),
        );
    };
    let said = lock(&shut.stderr).clone();
    let reports: Vec<&str> = said.lines().filter(|l| l.contains(START_REPORT)).collect();
    let mut violations = Vec::new();
    if reports.len() < 2 {
        violations.push(format!(
            "spawn {}: its start failed all along, and it said so {} time(s), not again and \
             again: {}",
            shut.spawn,
            reports.len(),
            shut.stderr_tail()
        ));
    }
    if let Some(line) = reports.iter().find(|l| !l.contains(crate::rows::TABLE)) {
        violations.push(format!(
            "spawn {}: a start report does not name the table: {line}",
            shut.spawn
        ));
    }
    if reports.len() > 12 {
        violations.push(format!(
            "spawn {}: {} start reports: it tried again without waiting",
            shut.spawn,
            reports.len()
        ));
    }
    (violations, vec![format!("start_reports={}", reports.len())])
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
        Scenario::PoisonRows | Scenario::FailedStart | Scenario::Pooler => faults.notes.join(" "),
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
