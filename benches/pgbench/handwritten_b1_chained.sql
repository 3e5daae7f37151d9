-- Hand-written baseline, batch 1, one transaction per job: the seeds' claim with the
-- DELETE of the row this client claimed in its previous transaction folded in as a
-- data-modifying CTE (one statement, one commit). The runner defines id = 0 for the
-- first transaction, whose DELETE matches nothing.
-- The claim reads the DELETE's count so that the DELETE runs first. A CTE nobody reads
-- runs after the main query, and a row that FOR UPDATE locked but whose recheck then
-- failed stays locked to the end of the transaction: two clients could each hold the
-- other's previous row and wait to delete their own (5 deadlocks in 20,000 jobs).
WITH done AS (
    DELETE FROM bench_jobs WHERE id = :id RETURNING 1
), c AS (
    SELECT id FROM bench_jobs
     WHERE (status = 'pending' OR (status = 'running' AND claimed_until < now()))
       AND (SELECT count(*) FROM done) >= 0
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
