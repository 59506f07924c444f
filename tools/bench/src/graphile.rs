//! The peer graphile-worker (Node.js, `tools/bench/graphile/`): `--peer graphile`, with its
//! named queues `--peer graphile:queues`, and with its batching options `..:batch`.
//!
//! - Installed with `npm ci` in `tools/bench/graphile/` (graphile-worker 0.17.3, the newest
//!   that runs on Node 20), where `node_modules` is missing.
//! - Before each of its runs, `run.mjs prepare`: graphile-worker's migrations, its job tables
//!   emptied, then the backlog added in one statement of `graphile_worker.add_job`, each
//!   payload carrying its insert time. With `queues`, each job goes into the named queue of
//!   its key (`k<n % K>`, the K keys of the advisory form): graphile-worker runs one job of a
//!   queue at a time, in order, as the advisory form runs one row of a key.
//! - The run, `run.mjs run`: a runner of W concurrent jobs with a pool of W + 2 connections,
//!   the task recording its pickup latency and working `--handler-ms`. With `batch`, a local
//!   queue of W + 1 jobs and batched completions (`completeJobBatchDelay` 0). The clock runs
//!   from the runner's start to the last job gone from the table (a connection of the
//!   script's own polls every millisecond once every task has ended). graphile-worker's
//!   statements are not counted, nor its connections.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::stats::Stats;
use crate::{BoxError, Config};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("graphile")
}

/// `npm ci` where graphile-worker is not installed yet.
fn install() -> Result<(), BoxError> {
    let dir = dir();
    if dir.join("node_modules/graphile-worker").is_dir() {
        return Ok(());
    }
    let status = std::process::Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund"])
        .current_dir(&dir)
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("graphile-worker: running npm in {}: {e}", dir.display()))?;
    if !status.success() {
        return Err(format!(
            "graphile-worker: npm ci in {} failed: {status}",
            dir.display()
        )
        .into());
    }
    Ok(())
}

async fn node(args: &[String]) -> Result<String, BoxError> {
    let out = tokio::process::Command::new("node")
        .arg(dir().join("run.mjs"))
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .await
        .map_err(|e| format!("graphile-worker: running node: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "graphile-worker: run.mjs {} failed: {}",
            args[0], out.status
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Before a run: graphile-worker's schema, no jobs, and the backlog.
pub(crate) async fn prepare(config: &Config, url: &str, queues: bool) -> Result<(), BoxError> {
    install()?;
    node(&[
        "prepare".into(),
        url.into(),
        config.jobs.to_string(),
        config.keys.to_string(),
        u8::from(queues).to_string(),
    ])
    .await?;
    Ok(())
}

#[derive(Deserialize)]
struct Ran {
    elapsed_s: f64,
    pickups_ms: Vec<f64>,
}

/// One run on the prepared backlog: the time from the runner's start to the last job gone.
pub(crate) async fn run(
    config: &Config,
    url: &str,
    batch: bool,
    stats: Arc<Stats>,
) -> Result<Duration, BoxError> {
    let line = node(&[
        "run".into(),
        url.into(),
        config.jobs.to_string(),
        config.workers.to_string(),
        config.handler_ms.to_string(),
        u8::from(batch).to_string(),
    ])
    .await?;
    let ran: Ran = serde_json::from_str(line.trim())
        .map_err(|e| format!("graphile-worker: reading `{}`: {e}", line.trim()))?;
    stats.pickups_from(ran.pickups_ms.iter().map(|ms| (ms * 1000.0) as i64));
    Ok(Duration::from_secs_f64(ran.elapsed_s))
}
