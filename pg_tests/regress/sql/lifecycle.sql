-- A row's life through the SQL functions, and what every step answers.
-- Epochs start at the timeline's floor: 1 << 40 = 1099511627776.
\set VERBOSITY sqlstate
SELECT lease.create_queue('q', backoff_base => '0', backoff_max => '0', max_attempts => 2,
                          retention => '1 hour');
SELECT lease.enqueue('q', '{"n": 1}', priority => 1) AS a,
       lease.enqueue('q', '{"n": 2}') AS b \gset

-- Claims go by priority; every claim issues a greater epoch.
SELECT id = :a AS is_a, payload, epoch, attempt FROM lease.claim_pending(1, '1 minute', 'w', 'q');
SELECT (lease.renew(:a, 'w', 1099511627776, '2 minutes')).held;
SELECT (lease.renew(:a, 'other', 1099511627776, '2 minutes')).held;

-- Fenced writes: the current token passes, a stale one changes nothing.
SELECT lease.fenced_update(:a, 1099511627776, '{"n": 10}');
SELECT lease.fenced_update(:a, 1099511627775, '{"n": 11}');
SELECT payload FROM lease.job WHERE id = :a;

-- A retry comes back (no backoff here) under a new epoch, then fails for good.
SELECT lease.release(:a, 'w', 1099511627776, 'retry', error => 'flaky');
SELECT lease.release(:a, 'w', 1099511627776, 'done');
SELECT id = :a AS is_a, epoch, attempt FROM lease.claim_pending(1, '1 minute', 'w', 'q');
SELECT lease.release(:a, 'w', 1099511627777, 'retry');
SELECT state, attempt, last_error FROM lease.job WHERE id = :a;
SELECT lease.requeue(:a);
SELECT state, attempt FROM lease.job WHERE id = :a;

-- Abandon gives the attempt back; done keeps the row for the queue's retention.
SELECT count(*) AS claimed FROM lease.claim_pending(10, '1 minute', 'w', 'q');
SELECT lease.release(:b, 'w', 1099511627776, 'abandon');
SELECT state, attempt FROM lease.job WHERE id = :b;
SELECT id = :b AS is_b, epoch, attempt FROM lease.claim_pending(10, '1 minute', 'w', 'q');
SELECT id = :a AS is_a, released
  FROM lease.release_batch(ARRAY[:a, :b], 'w', ARRAY[1099511627778, 1099511627777]);
SELECT id = :a AS is_a, state FROM lease.job ORDER BY id;

-- Cancel: a pending row at once, a leased one when its lease ends.
SELECT lease.enqueue('q', '{}') AS c, lease.enqueue('q', '{}') AS d \gset
SELECT lease.cancel(:c);
SELECT count(*) FROM lease.claim_pending(1, '1 minute', 'w', 'q');
SELECT lease.cancel(:d);
SELECT (lease.renew(:d, 'w', 1099511627776, '1 minute')).cancel_requested;
SELECT lease.release(:d, 'w', 1099511627776, 'retry');
SELECT state FROM lease.job WHERE id IN (:c, :d) ORDER BY id;

-- Per-key concurrency: one row of the key at a time, the next admitted
-- when it ends.
SELECT lease.create_queue('serial', concurrency => 1);
SELECT lease.enqueue('serial', '{"i": 1}', concurrency_key => 'k') AS k1,
       lease.enqueue('serial', '{"i": 2}', concurrency_key => 'k') AS k2 \gset
SELECT id = :k1 AS is_k1, held FROM lease.job WHERE queue = 'serial' ORDER BY id;
SELECT count(*) FROM lease.claim_pending(10, '1 minute', 'w', 'serial');
SELECT lease.release(:k1, 'w', 1099511627776);
SELECT id = :k2 AS is_k2, held FROM lease.job WHERE queue = 'serial' ORDER BY id;
SELECT queue, ready, held, leased FROM lease.metrics WHERE queue = 'serial';

-- Named leases: one holder, epochs that only grow.
SELECT lease.try_acquire('leader', 'a', '1 minute');
SELECT lease.try_acquire('leader', 'b', '1 minute');
SELECT * FROM lease.release_named_batch(ARRAY['leader'], 'a', ARRAY[1099511627776]);
SELECT lease.try_acquire('leader', 'b', '1 minute');
