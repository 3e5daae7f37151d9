-- Hand-written baseline: extend claimed_until of one of this client's 64 running rows
-- (rows 1 + 64c .. 64 + 64c, set up by the runner); no owner or epoch check.
\set id 1 + :client_id * 64 + random(0, 63)
UPDATE bench_jobs SET claimed_until = now() + interval '1 hour' WHERE id = :id AND status = 'running';
