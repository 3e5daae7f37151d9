-- pg_lease, batch 1, one transaction per job: release_and_claim records the job this
-- client claimed in its previous transaction done (the queue keeps no history, so the
-- row is deleted), fenced by (id, epoch), and claims the next in the same statement.
-- The runner defines id = 0 and epoch = 0 for the first transaction, whose release
-- refuses that token; each client runs one transaction more than it claims jobs.
SELECT coalesce(max(id) FILTER (WHERE released IS NULL), 0) AS id,
       coalesce(max(epoch), 0) AS epoch
  FROM lease.release_and_claim(ARRAY[:id]::bigint[], 'bench-' || :client_id, ARRAY[:epoch]::bigint[],
                               1, '30 seconds', 'q')
\gset
