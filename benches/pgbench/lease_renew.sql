-- pg_lease: renew one of this client's 64 leases (set up by the runner: client c holds
-- rows :base + 64c .. :base + 64c + 63, all at epoch :epoch, owner 'bench-<c>').
\set id :base + :client_id * 64 + random(0, 63)
SELECT (lease.renew(:id, 'bench-' || :client_id, :epoch, '1 hour')).held;
