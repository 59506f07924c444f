-- The row lock form's job: the attempt counted and committed, then the row locked in a
-- transaction held through the handler, deleted, committed. One round trip a statement.
UPDATE pgbench_jobs SET attempt = attempt + 1
WHERE id = (SELECT id FROM pgbench_jobs ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id AS id, attempt AS attempt \gset
BEGIN;
SELECT id FROM pgbench_jobs WHERE id = :id AND attempt = :attempt FOR UPDATE SKIP LOCKED;
DELETE FROM pgbench_jobs WHERE id = :id;
COMMIT;
