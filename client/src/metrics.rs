//! The metrics the client reports through the [`metrics`] facade. Nothing
//! is recorded unless the application installs a recorder (for example
//! `metrics-exporter-prometheus`; `examples/prometheus.rs` serves them),
//! and a Worker reports to the recorder installed when it starts (it makes
//! its metric handles once, not per job).
//!
//! | name | kind | unit | labels | what |
//! |---|---|---|---|---|
//! | `pg_lease_jobs_total` | counter | jobs | `queue`, `event` | a Worker's jobs by event: `claimed`, `done`, `retried`, `failed`, `abandoned`, `lost` (a release the database refused: the lease had ended), `unreleased` (a release given up after errors), `panicked` |
//! | `pg_lease_handler_seconds` | histogram | seconds | `queue`, `outcome` | how long handlers ran, by the outcome they answered |
//! | `pg_lease_claim_seconds` | histogram | seconds | `queue` | latency of a Worker's claim requests |
//! | `pg_lease_claim_wait_seconds` | histogram | seconds | `queue` | how long each row a Worker claimed had been claimable ([`Lease::waited`](crate::Lease::waited): database clock; reclaims not counted) |
//! | `pg_lease_renew_seconds` | histogram | seconds | `queue` | latency of a Worker's heartbeats (one `renew_batch`) |
//! | `pg_lease_leases_held` | gauge | leases | `queue` | leases a Worker holds, at its last heartbeat |
//! | `pg_lease_jobs_running` | gauge | jobs | `queue` | handlers running now |
//! | `pg_lease_slots_free` | gauge | slots | `queue` | `concurrency` minus handlers running |
//! | `pg_lease_leader` | gauge | 0 or 1 | `name` | whether this process's Elector leads |

/// Jobs by event.
pub const JOBS: &str = "pg_lease_jobs_total";
/// Handler durations.
pub const HANDLER_SECONDS: &str = "pg_lease_handler_seconds";
/// Claim request latency.
pub const CLAIM_SECONDS: &str = "pg_lease_claim_seconds";
/// Time from claimable to claimed.
pub const CLAIM_WAIT_SECONDS: &str = "pg_lease_claim_wait_seconds";
/// Heartbeat latency.
pub const RENEW_SECONDS: &str = "pg_lease_renew_seconds";
/// Leases held.
pub const LEASES_HELD: &str = "pg_lease_leases_held";
/// Handlers running.
pub const JOBS_RUNNING: &str = "pg_lease_jobs_running";
/// Free slots.
pub const SLOTS_FREE: &str = "pg_lease_slots_free";
/// Leadership of an Elector.
pub const LEADER: &str = "pg_lease_leader";
