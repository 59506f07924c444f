//! What one run measures: settlements, latencies, statements, connections, memory.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};

/// The message every job carries: when it was published, in microseconds since the epoch.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Job {
    /// The publish time, microseconds since the Unix epoch.
    pub t: i64,
}

/// The wall clock in microseconds since the Unix epoch.
pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// The counters and samples of one run, shared by its workers.
pub(crate) struct Stats {
    settled: AtomicU64,
    pickup_us: Mutex<Vec<i64>>,
    settle_us: Mutex<Vec<i64>>,
    ended: Mutex<HashMap<i64, Instant>>,
    statements: Mutex<BTreeMap<String, u64>>,
    /// Total time from issuing to the reply, by kind, in microseconds.
    timings: Mutex<BTreeMap<String, u64>>,
    /// While a timeline samples the run: each claim statement's time from issue to reply,
    /// microseconds, since the last sample.
    claim_us: Mutex<Option<Vec<i64>>>,
    held: AtomicI64,
    peak: AtomicI64,
    last_progress: Mutex<Instant>,
    /// When the last row settled, microseconds since the Unix epoch.
    last_settled_us: AtomicI64,
    /// The advisory form: each key's handlers, for the order check.
    pub(crate) order: crate::order::Log,
    pub(crate) bar: ProgressBar,
}

impl Stats {
    pub(crate) fn new(bar: ProgressBar) -> Self {
        Self {
            settled: AtomicU64::new(0),
            pickup_us: Mutex::new(Vec::new()),
            settle_us: Mutex::new(Vec::new()),
            ended: Mutex::new(HashMap::new()),
            statements: Mutex::new(BTreeMap::new()),
            timings: Mutex::new(BTreeMap::new()),
            claim_us: Mutex::new(None),
            held: AtomicI64::new(0),
            peak: AtomicI64::new(0),
            last_progress: Mutex::new(Instant::now()),
            last_settled_us: AtomicI64::new(0),
            order: crate::order::Log::default(),
            bar,
        }
    }

    /// Rows settled so far.
    pub(crate) fn settled(&self) -> u64 {
        self.settled.load(Ordering::SeqCst)
    }

    /// How long since the last settlement (or since the run began).
    pub(crate) fn idle(&self) -> Duration {
        self.last_progress.lock().expect("not poisoned").elapsed()
    }

    /// A handler starts on a message with this payload: records its pickup latency.
    pub(crate) fn handler_start(&self, payload: &[u8]) {
        if let Ok(job) = serde_json::from_slice::<Job>(payload) {
            self.pickup(job.t);
        }
    }

    /// A handler starts on a message published at `t`: records its pickup latency.
    pub(crate) fn pickup(&self, t: i64) {
        let now = now_us();
        self.pickup_us.lock().expect("not poisoned").push(now - t);
    }

    /// Pickup latencies measured elsewhere (a peer's own process), in microseconds.
    pub(crate) fn pickups_from(&self, pickups: impl IntoIterator<Item = i64>) {
        self.pickup_us.lock().expect("not poisoned").extend(pickups);
    }

    /// A handler ended on row `id` (for the framework, whose settlement is seen elsewhere).
    pub(crate) fn handler_end(&self, id: i64) {
        self.ended
            .lock()
            .expect("not poisoned")
            .insert(id, Instant::now());
    }

    /// Row `id` is settled: records the settle latency from its handler's end.
    pub(crate) fn settled_row(&self, id: i64) {
        let ended = self.ended.lock().expect("not poisoned").remove(&id);
        if let Some(ended) = ended {
            self.settle_latency(ended.elapsed());
        }
        self.settled_one();
    }

    /// A settle latency measured directly (the baseline).
    pub(crate) fn settle_latency(&self, latency: Duration) {
        self.settle_us
            .lock()
            .expect("not poisoned")
            .push(latency.as_micros() as i64);
    }

    /// One more row settled.
    pub(crate) fn settled_one(&self) {
        self.settled.fetch_add(1, Ordering::SeqCst);
        self.last_settled_us.store(now_us(), Ordering::SeqCst);
        *self.last_progress.lock().expect("not poisoned") = Instant::now();
        self.bar.inc(1);
    }

    /// When the last row settled, microseconds since the Unix epoch (0: none yet).
    pub(crate) fn last_settled_us(&self) -> i64 {
        self.last_settled_us.load(Ordering::SeqCst)
    }

    /// Another process's settlements: moves the bar and the time of the last progress.
    pub(crate) fn progressed(&self, rows: u64) {
        if rows > 0 {
            *self.last_progress.lock().expect("not poisoned") = Instant::now();
            self.bar.inc(rows);
        }
    }

    /// What this run measured, to send to the parent process.
    pub(crate) fn report(&self) -> Report {
        let (order, order_error) = self.order.take();
        Report {
            settled: self.settled(),
            last_settled_us: self.last_settled_us(),
            pickup_us: self.pickup_us.lock().expect("not poisoned").clone(),
            settle_us: self.settle_us.lock().expect("not poisoned").clone(),
            statements: self.statements(),
            timings_us: self.timings.lock().expect("not poisoned").clone(),
            peak_connections: self.peak_connections(),
            peak_memory_kib: peak_memory_kib(),
            order,
            order_error,
        }
    }

    /// Adds what a child process measured: its settlements, samples, statements and spans.
    /// Its peak connections add to this run's (the sum of each process's peak).
    pub(crate) fn absorb(&self, report: Report) {
        self.settled.fetch_add(report.settled, Ordering::SeqCst);
        self.last_settled_us
            .fetch_max(report.last_settled_us, Ordering::SeqCst);
        self.pickup_us
            .lock()
            .expect("not poisoned")
            .extend(report.pickup_us);
        self.settle_us
            .lock()
            .expect("not poisoned")
            .extend(report.settle_us);
        {
            let mut statements = self.statements.lock().expect("not poisoned");
            for (kind, n) in report.statements {
                *statements.entry(kind).or_insert(0) += n;
            }
        }
        {
            let mut timings = self.timings.lock().expect("not poisoned");
            for (kind, us) in report.timings_us {
                *timings.entry(kind).or_insert(0) += us;
            }
        }
        self.peak
            .fetch_add(report.peak_connections, Ordering::SeqCst);
        self.order.absorb(report.order, report.order_error);
    }

    /// One statement (or pool operation) of this kind ran.
    pub(crate) fn count(&self, kind: &str) {
        let mut statements = self.statements.lock().expect("not poisoned");
        match statements.get_mut(kind) {
            Some(n) => *n += 1,
            None => {
                statements.insert(kind.to_owned(), 1);
            }
        }
    }

    /// A statement (or pool operation) of this kind took `took`, from issue to reply.
    pub(crate) fn timed(&self, kind: &str, took: Duration) {
        let us = took.as_micros() as u64;
        if crate::timeline::is_claim(kind)
            && let Some(samples) = self.claim_us.lock().expect("not poisoned").as_mut()
        {
            samples.push(us as i64);
        }
        let mut timings = self.timings.lock().expect("not poisoned");
        match timings.get_mut(kind) {
            Some(n) => *n += us,
            None => {
                timings.insert(kind.to_owned(), us);
            }
        }
    }

    /// The mean time from issue to reply, by kind, in microseconds.
    pub(crate) fn mean_us(&self) -> BTreeMap<String, u64> {
        let counts = self.statements();
        self.timings
            .lock()
            .expect("not poisoned")
            .iter()
            .map(|(k, total)| {
                let n = counts.get(k).copied().unwrap_or(1).max(1);
                (k.clone(), total / n)
            })
            .collect()
    }

    /// From now on keeps each claim statement's time for [`Stats::take_claim_samples`].
    pub(crate) fn keep_claim_samples(&self) {
        *self.claim_us.lock().expect("not poisoned") = Some(Vec::new());
    }

    /// The claim statements' times since the last call, microseconds.
    pub(crate) fn take_claim_samples(&self) -> Vec<i64> {
        self.claim_us
            .lock()
            .expect("not poisoned")
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// A connection was taken.
    pub(crate) fn acquired(&self) {
        let held = self.held.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(held, Ordering::SeqCst);
    }

    /// A connection was given back or closed.
    pub(crate) fn released(&self) {
        self.held.fetch_sub(1, Ordering::SeqCst);
    }

    /// `n` connections were seen held at once (a sample, for the peer's pool).
    pub(crate) fn peak_at_least(&self, n: i64) {
        self.peak.fetch_max(n, Ordering::SeqCst);
    }

    /// The most connections held at once.
    pub(crate) fn peak_connections(&self) -> i64 {
        self.peak.load(Ordering::SeqCst)
    }

    /// The statements run, by kind.
    pub(crate) fn statements(&self) -> BTreeMap<String, u64> {
        self.statements.lock().expect("not poisoned").clone()
    }

    /// Pickup latencies, in microseconds, sorted.
    pub(crate) fn pickups(&self) -> Vec<i64> {
        let mut v = self.pickup_us.lock().expect("not poisoned").clone();
        v.sort_unstable();
        v
    }

    /// Settle latencies, in microseconds, sorted.
    pub(crate) fn settles(&self) -> Vec<i64> {
        let mut v = self.settle_us.lock().expect("not poisoned").clone();
        v.sort_unstable();
        v
    }
}

/// What one child process measured in its run (tools/bench/src/scale.rs), sent to the parent as
/// one JSON line.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Report {
    /// Rows it settled.
    pub(crate) settled: u64,
    /// When its last row settled, microseconds since the Unix epoch.
    pub(crate) last_settled_us: i64,
    /// Its pickup latencies, microseconds.
    pub(crate) pickup_us: Vec<i64>,
    /// Its settle latencies, microseconds.
    pub(crate) settle_us: Vec<i64>,
    /// Its statements by kind.
    pub(crate) statements: BTreeMap<String, u64>,
    /// The total time of each kind of statement, microseconds.
    pub(crate) timings_us: BTreeMap<String, u64>,
    /// The most connections it held at once.
    pub(crate) peak_connections: i64,
    /// Its `VmHWM`, KiB.
    pub(crate) peak_memory_kib: Option<u64>,
    /// The advisory form: its handlers' spans by key.
    pub(crate) order: BTreeMap<String, Vec<crate::order::Span>>,
    /// The first break of the order's rules it saw.
    pub(crate) order_error: Option<String>,
}

/// The `q` quantile (0..=1) of sorted samples in microseconds, in milliseconds.
pub(crate) fn quantile_ms(sorted: &[i64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    Some(sorted[i.min(sorted.len() - 1)] as f64 / 1000.0)
}

/// The median of some numbers.
pub(crate) fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Resets the process's peak resident set size (`VmHWM`), so the next reading is this run's.
/// Answers whether the kernel took the reset.
pub(crate) fn reset_peak_memory() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The process's peak resident set size in KiB (`VmHWM` of `/proc/self/status`).
pub(crate) fn peak_memory_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|line| {
        line.strip_prefix("VmHWM:")?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    })
}

/// CPU time read at a moment: this process's (user and system, with its threads) and the
/// machine's busy and total, in clock ticks (`/proc/self/stat`, `/proc/stat`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct CpuMark {
    process: u64,
    busy: u64,
    total: u64,
}

impl CpuMark {
    /// Now, where `/proc` can be read.
    pub(crate) fn now() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // The fields after the command's closing parenthesis; utime and stime are the 14th
        // and 15th of the line, the 12th and 13th after it.
        let after = &stat[stat.rfind(')')? + 1..];
        let fields: Vec<&str> = after.split_whitespace().collect();
        let process = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        let machine = std::fs::read_to_string("/proc/stat").ok()?;
        let cpu: Vec<u64> = machine
            .lines()
            .next()?
            .strip_prefix("cpu ")?
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal (guest time is inside user).
        let total: u64 = cpu.iter().take(8).sum();
        let idle = cpu.get(3)? + cpu.get(4).copied().unwrap_or(0);
        Some(Self {
            process,
            busy: total - idle,
            total,
        })
    }

    /// What was used since `self`: this process's CPU in microseconds per job, and the share
    /// of the machine's CPU time that was busy (every process, the database's included).
    pub(crate) fn since(self, jobs: u64) -> Option<CpuUse> {
        let now = Self::now()?;
        // Clock ticks are 100 a second on Linux (USER_HZ).
        let us_per_tick = 10_000.0;
        let total = now.total.checked_sub(self.total)?;
        Some(CpuUse {
            client_cpu_us_per_job: (now.process - self.process) as f64 * us_per_tick
                / jobs.max(1) as f64,
            machine_busy: (total > 0).then(|| (now.busy - self.busy) as f64 / total as f64),
        })
    }
}

/// CPU used by a run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CpuUse {
    pub(crate) client_cpu_us_per_job: f64,
    pub(crate) machine_busy: Option<f64>,
}

/// The 1-minute load average, from `/proc/loadavg`.
pub(crate) fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Now as `YYYY-MM-DDTHH:MM:SSZ`.
pub(crate) fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
