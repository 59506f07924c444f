-- The row lock form's job as row_lock.sql, with BEGIN and the lock in one round trip and the
-- delete and COMMIT in another (pgbench's pipeline mode, -M extended or prepared).
UPDATE pgbench_jobs SET attempt = attempt + 1
WHERE id = (SELECT id FROM pgbench_jobs ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id AS id, attempt AS attempt \gset
\startpipeline
BEGIN;
SELECT id FROM pgbench_jobs WHERE id = :id AND attempt = :attempt FOR UPDATE SKIP LOCKED;
\endpipeline
\startpipeline
DELETE FROM pgbench_jobs WHERE id = :id;
COMMIT;
\endpipeline
