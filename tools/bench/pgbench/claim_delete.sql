-- A lease-like job, as graphile-worker runs one: one statement marks the first free row taken
-- and counts its attempt (committed alone), a second deletes it. Nothing is held through the
-- handler.
UPDATE pgbench_jobs SET attempt = attempt + 1, locked_at = now()
WHERE id = (SELECT id FROM pgbench_jobs WHERE locked_at IS NULL ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id AS id \gset
DELETE FROM pgbench_jobs WHERE id = :id;
