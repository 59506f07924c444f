// graphile-worker on the bench's jobs (tools/bench/src/graphile.rs runs it).
//
//   node tools/bench/graphile/run.mjs prepare URL JOBS KEYS QUEUES
//     graphile-worker's migrations, its job tables emptied, then JOBS jobs of task `bench`
//     added by `graphile_worker.add_job` in one statement, each payload carrying its insert
//     time in microseconds; with QUEUES = 1 each job in the named queue `k<n % KEYS>` (one
//     job of a queue in work at a time, in order), as the advisory form's keys.
//   node tools/bench/graphile/run.mjs run URL JOBS WORKERS HANDLER_MS BATCH
//     a runner with WORKERS concurrent jobs (and a pool of WORKERS + 2 connections); with
//     BATCH = 1 its batching options: a local queue of WORKERS + 1 jobs and completions
//     batched (`completeJobBatchDelay` 0). The task records its pickup latency and works
//     HANDLER_MS (a resolved promise when 0). The clock runs from the runner's start to the
//     last job gone from the table. Prints one JSON line: elapsed_s, pickups_ms (sorted).
import { run, runMigrations, Logger } from "graphile-worker";
import pg from "pg";

const [mode, url, ...rest] = process.argv.slice(2);
const quiet = new Logger(() => () => {});
const nowUs = () => Number(process.hrtime.bigint() / 1000n) + epochOffsetUs;
// hrtime is monotonic; the payloads carry the database's wall clock: align once.
const epochOffsetUs = Date.now() * 1000 - Number(process.hrtime.bigint() / 1000n);

async function prepare(jobs, keys, queues) {
  await runMigrations({ connectionString: url, logger: quiet });
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  await client.query(
    "TRUNCATE graphile_worker._private_jobs, graphile_worker._private_job_queues CASCADE",
  );
  await client.query(
    `SELECT graphile_worker.add_job(
       'bench',
       json_build_object('t', (extract(epoch FROM clock_timestamp()) * 1000000)::bigint),
       queue_name => CASE WHEN $3 THEN 'k' || (n % $2) ELSE NULL END)
     FROM generate_series(0, $1 - 1) AS n`,
    [jobs, keys, queues],
  );
  await client.end();
}

async function work(jobs, workers, handlerMs, batch) {
  const probe = new pg.Client({ connectionString: url });
  await probe.connect();
  const pickups = [];
  let ended = 0;
  let allEnded;
  const done = new Promise((resolve) => (allEnded = resolve));
  const preset = batch
    ? { worker: { localQueue: { size: workers + 1 }, completeJobBatchDelay: 0 } }
    : {};
  const started = process.hrtime.bigint();
  const runner = await run({
    connectionString: url,
    concurrency: workers,
    maxPoolSize: workers + 2,
    noHandleSignals: true,
    pollInterval: 1000,
    logger: quiet,
    preset,
    taskList: {
      bench: async (payload) => {
        pickups.push((nowUs() - payload.t) / 1000);
        if (handlerMs > 0) {
          await new Promise((r) => setTimeout(r, handlerMs));
        }
        ended += 1;
        if (ended === jobs) allEnded();
      },
    },
  });
  const stall = setTimeout(() => {
    console.error(`graphile-worker: ${ended} of ${jobs} jobs ended after 300 s`);
    process.exit(1);
  }, 300_000);
  await done;
  // The last completions reach the table after the task returns.
  for (;;) {
    const { rows } = await probe.query(
      "SELECT count(*)::int AS n FROM graphile_worker._private_jobs",
    );
    if (rows[0].n === 0) break;
    await new Promise((r) => setTimeout(r, 1));
  }
  const elapsed = Number(process.hrtime.bigint() - started) / 1e9;
  clearTimeout(stall);
  await runner.stop();
  await probe.end();
  pickups.sort((a, b) => a - b);
  console.log(JSON.stringify({ elapsed_s: elapsed, pickups_ms: pickups }));
}

if (mode === "prepare") {
  const [jobs, keys, queues] = rest.map(Number);
  await prepare(jobs, keys, queues === 1);
} else if (mode === "run") {
  const [jobs, workers, handlerMs, batch] = rest.map(Number);
  await work(jobs, workers, handlerMs, batch === 1);
} else {
  console.error("usage: run.mjs prepare URL JOBS KEYS QUEUES | run URL JOBS WORKERS HANDLER_MS BATCH");
  process.exit(2);
}
