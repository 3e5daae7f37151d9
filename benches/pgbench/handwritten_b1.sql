-- Hand-written baseline, batch 1: the seeds' claim (CTE + FOR UPDATE SKIP LOCKED,
-- claimed_until, no owner, no epoch), then completion in its own transaction.
-- An empty claim yields id 0, whose DELETE matches nothing.
WITH c AS (
    SELECT id FROM bench_jobs
     WHERE status = 'pending' OR (status = 'running' AND claimed_until < now())
     ORDER BY id
     LIMIT 1
       FOR UPDATE SKIP LOCKED
), u AS (
    UPDATE bench_jobs j
       SET status = 'running', claimed_until = now() + interval '30 seconds', attempts = j.attempts + 1
      FROM c
     WHERE j.id = c.id
    RETURNING j.id
)
SELECT coalesce(max(id), 0) AS id FROM u
\gset
DELETE FROM bench_jobs WHERE id = :id;
