-- Run by the docker stand-in before it wipes a cluster: pg_lease's account
-- of the benchmark's queue, from the table and the counters every state
-- change keeps in the same transaction. With no row ever failing, every row
-- enqueued is either done (and deleted: retention 0) or still waiting or
-- leased; `unaccounted` counts rows that are neither, so 0 means no job was
-- lost. A row finishes once: a second release of it is refused by its epoch,
-- so `claimed_total - done_total` counts runs given up (a killed replica's
-- leases, reaped or abandoned and run again), never a second completion.
SELECT json_build_object(
    'enqueued_total', m.enqueued_total,
    'done_total', m.done_total,
    'claimed_total', m.claimed_total,
    'recovered_total', m.recovered_total,
    'retried_total', m.retried_total,
    'dead_total', m.dead_total,
    'rows_left', r.rows_left,
    'leased_left', r.leased_left,
    'attempts_over_1', r.attempts_over_1,
    'unaccounted', m.enqueued_total - m.done_total - r.rows_left
)
FROM lease.metrics AS m,
     LATERAL (SELECT count(*) AS rows_left,
                     count(*) FILTER (WHERE state = 'leased') AS leased_left,
                     count(*) FILTER (WHERE attempt > 1) AS attempts_over_1
              FROM lease.job WHERE queue = m.queue) AS r
WHERE m.queue = 'field_bench';
