-- Bad input to every SQL function: an ERROR with the documented SQLSTATE
-- (docs/sql.md) and nothing changed. Only the code is shown.
\set VERBOSITY sqlstate
SELECT lease.create_queue('q', concurrency => 2);
SELECT lease.enqueue('q', '{}') AS id \gset

-- null_value_not_allowed (22004)
SELECT lease.create_queue(NULL);
SELECT lease.enqueue(NULL, '{}');
SELECT lease.enqueue('q', NULL);
SELECT lease.enqueue_batch('q', ARRAY['{}', NULL]::jsonb[]);
SELECT lease.claim_pending(NULL, '1 minute', 'w', 'q');
SELECT lease.claim_pending(1, NULL, 'w', 'q');
SELECT lease.claim_pending(1, '1 minute', NULL, 'q');
SELECT lease.claim_pending(1, '1 minute', 'w', NULL);
SELECT lease.renew(NULL, 'w', 1, '1 minute');
SELECT lease.release(:id, 'w', NULL);
SELECT lease.try_acquire(NULL, 'w', '1 minute');
SELECT lease.cancel(NULL);
SELECT lease.requeue(NULL);

-- invalid_parameter_value (22023)
SELECT lease.create_queue('');
SELECT lease.create_queue('q', max_attempts => 0);
SELECT lease.create_queue('q', backoff_base => '1 hour', backoff_max => '1 minute');
SELECT lease.create_queue('q', backoff_base => '1 month');
SELECT lease.create_queue('q', jitter => 'some');
SELECT lease.create_queue('q', concurrency => 0);
SELECT lease.enqueue('q', '{}', run_at => 'infinity');
SELECT lease.enqueue('q', '{}', concurrency_key => '');
SELECT lease.enqueue('default', '{}', concurrency_key => 'a');
SELECT lease.enqueue_batch('q', ARRAY['{}', '{}']::jsonb[], keys => ARRAY['a']);
SELECT lease.enqueue_batch('q', ARRAY['{}', '{}']::jsonb[], concurrency_keys => ARRAY['a']);
SELECT lease.claim_pending(0, '1 minute', 'w', 'q');
SELECT lease.claim_pending(10001, '1 minute', 'w', 'q');
SELECT lease.claim_pending(1, '0', 'w', 'q');
SELECT lease.claim_pending(1, '2 days', 'w', 'q');
SELECT lease.claim_pending(1, '1 minute', '', 'q');
SELECT lease.claim_pending(1, '1 minute', repeat('w', 257), 'q');
SELECT lease.release(:id, 'w', 1, 'later');
SELECT lease.release(:id, 'w', 1, 'retry', retry_at => 'infinity');
SELECT lease.release_batch(ARRAY[1, 2], 'w', ARRAY[1]);
SELECT lease.renew_batch(ARRAY[1], 'w', ARRAY[1, 2], '1 minute');
SELECT lease.try_acquire('', 'w', '1 minute');

-- undefined_object (42704)
SELECT lease.enqueue('nope', '{}');
SELECT lease.claim_pending(1, '1 minute', 'w', 'nope');
SELECT lease.drop_queue('nope');

-- wrong_object_type (42809): the queue of an attached table takes no enqueue
CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL);
SELECT lease.attach('orders', 'status = ''new''', queue => 'orders');
SELECT lease.enqueue('orders', '{}');

-- object_in_use (55006)
SELECT lease.drop_queue('q');

-- lease lost (LE001)
BEGIN;
SELECT lease.fence(:id, 1);
ROLLBACK;
BEGIN;
SELECT lease.fence_named('leader', 1);
ROLLBACK;

-- Nothing changed: the one row, pending, and the queues' policies.
SELECT id = :id AS same_row, state, attempt, epoch FROM lease.job;
SELECT name, max_attempts, concurrency FROM lease.queue ORDER BY name;
SELECT count(*) AS orders_rows FROM lease.job WHERE queue = 'orders';
