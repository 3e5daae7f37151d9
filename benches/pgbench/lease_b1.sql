-- pg_lease, batch 1: claim_pending, then release (outcome done; the queue keeps no
-- history, so the row is deleted) in its own transaction, fenced by (id, epoch).
-- An empty claim yields (0, 0), which release refuses (returns false).
SELECT coalesce(max(id), 0) AS id, coalesce(max(epoch), 0) AS epoch
  FROM lease.claim_pending(1, '30 seconds', 'bench-' || :client_id, 'q')
\gset
SELECT lease.release(:id, 'bench-' || :client_id, :epoch);
