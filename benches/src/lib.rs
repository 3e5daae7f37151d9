//! Shared by pg_lease's benchmark runner (`src/main.rs`, binary `bench`)
//! and the criterion benchmarks (`benches/client.rs`): the fixed cluster
//! settings every benchmark runs under, and starting such a cluster.

use pg_tests::{Cluster, ClusterConfig};

/// The cluster settings of every benchmark. The harness appends them after
/// its own `fsync = off` and `max_connections = 100`, so these win.
pub const SETTINGS: &[&str] = &[
    "shared_buffers = 1GB",
    "max_connections = 200",
    "fsync = on",
    "synchronous_commit = on",
    "full_page_writes = on",
    "checkpoint_timeout = 15min",
    "max_wal_size = 4GB",
    "autovacuum = on",
    "shared_preload_libraries = 'pg_lease'",
];

/// Starts a throwaway cluster with [`SETTINGS`] and the extension created in
/// [`pg_tests::TEST_DB`]; stopped and deleted when dropped. Panics with the
/// harness's message (tool output, server log) if it cannot start.
pub fn start_cluster() -> Cluster {
    Cluster::start_with(ClusterConfig {
        extra_conf: SETTINGS.iter().map(|s| (*s).to_owned()).collect(),
        create_extension: true,
        sweep_every: None,
    })
}
