-- A queue of 20,000 empty jobs for the scripts beside this file (table pgbench_jobs).
SET client_min_messages = warning;
DROP TABLE IF EXISTS pgbench_jobs;
CREATE TABLE pgbench_jobs (
    id bigserial PRIMARY KEY,
    attempt int NOT NULL DEFAULT 0,
    locked_at timestamptz,
    payload text NOT NULL
);
INSERT INTO pgbench_jobs (payload) SELECT '{}' FROM generate_series(1, 20000);
VACUUM ANALYZE pgbench_jobs;
