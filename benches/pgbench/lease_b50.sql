-- pg_lease, batch 50: claim_pending, then release_batch (outcome done; the queue keeps
-- no history, so the rows are deleted) in its own transaction, fenced by (id, epoch).
SELECT coalesce(array_agg(id), '{}')::text AS ids, coalesce(array_agg(epoch), '{}')::text AS epochs
  FROM lease.claim_pending(50, '30 seconds', 'bench-' || :client_id, 'q')
\gset
SELECT count(*) FROM lease.release_batch(:ids::bigint[], 'bench-' || :client_id, :epochs::bigint[]);
