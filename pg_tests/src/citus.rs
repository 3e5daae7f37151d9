//! A Citus cluster of real servers: a coordinator and worker nodes, each a
//! [`Cluster`] of its own with `citus` and `pg_lease` preloaded, joined by
//! `citus_add_node`, pg_lease created on the coordinator (Citus creates it on
//! the workers). Citus is built for Debian's PostgreSQL by `bin/prereqs`;
//! where it is missing, [`CitusCluster::start`] says so and the suites that
//! need it are reported SKIPPED by `bin/test`.

use crate::{Cluster, ClusterConfig, EXTENSION, TEST_DB};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Whether Citus is installed for the PostgreSQL under test (its library
/// in `pg_config --pkglibdir`, where `bin/test` looks too).
pub fn citus_available() -> bool {
    Command::new(crate::pg_bin_dir().join("pg_config"))
        .arg("--pkglibdir")
        .output()
        .ok()
        .filter(|out| out.status.success())
        .is_some_and(|out| {
            Path::new(String::from_utf8_lossy(&out.stdout).trim())
                .join("citus.so")
                .is_file()
        })
}

/// A coordinator and its worker nodes; dropping it stops every server.
#[derive(Debug)]
pub struct CitusCluster {
    /// The node clients connect to; it holds no shards.
    pub coordinator: Cluster,
    /// The nodes that hold the shards, in the order they were added.
    pub workers: Vec<Cluster>,
}

impl CitusCluster {
    /// Starts a coordinator and `workers` worker nodes, each with the
    /// reaper sweeping every `sweep_interval`. Panics with a clear message
    /// if Citus is missing ([`citus_available`]) or a step fails.
    pub fn start(workers: usize, sweep_interval: Duration) -> CitusCluster {
        CitusCluster::start_with(workers, sweep_interval, &[])
    }

    /// [`CitusCluster::start`] with `settings` appended to every node's
    /// `postgresql.conf` (a benchmark's, say).
    pub fn start_with(workers: usize, sweep_interval: Duration, settings: &[&str]) -> CitusCluster {
        assert!(
            citus_available(),
            "pg_tests: Citus is not installed for this PostgreSQL (bin/prereqs builds it for \
             PostgreSQL 15 from ../shared/citus/)"
        );
        let config = ClusterConfig {
            extra_conf: vec![
                format!("shared_preload_libraries = 'citus,{EXTENSION}'"),
                format!("lease.sweep_interval = '{}ms'", sweep_interval.as_millis()),
                // Citus commits a change of several nodes in two phases.
                "max_prepared_transactions = 100".into(),
            ]
            .into_iter()
            .chain(settings.iter().map(|s| (*s).to_owned()))
            .collect(),
            create_extension: false,
            sweep_every: None,
        };
        let start = || {
            let node = Cluster::start_with(config.clone());
            node.psql(TEST_DB, "CREATE EXTENSION citus");
            node
        };
        let coordinator = start();
        let workers: Vec<Cluster> = (0..workers).map(|_| start()).collect();
        coordinator.psql(
            TEST_DB,
            &format!(
                "SELECT citus_set_coordinator_host('127.0.0.1', {})",
                coordinator.port()
            ),
        );
        for worker in &workers {
            coordinator.psql(
                TEST_DB,
                &format!("SELECT citus_add_node('127.0.0.1', {})", worker.port()),
            );
        }
        coordinator.psql(TEST_DB, &format!("CREATE EXTENSION {EXTENSION}"));
        CitusCluster {
            coordinator,
            workers,
        }
    }

    /// The worker node that holds `queue`'s shard, by its port.
    pub async fn node_of(&self, client: &tokio_postgres::Client, queue: &str) -> &Cluster {
        let port: i32 = client
            .query_one(
                "SELECT p.nodeport FROM pg_dist_shard_placement p \
                 WHERE p.shardid = get_shard_id_for_distribution_column('lease.job', $1::text)",
                &[&queue],
            )
            .await
            .expect("the placement of a queue's shard")
            .get(0);
        self.workers
            .iter()
            .find(|w| i32::from(w.port()) == port)
            .unwrap_or_else(|| panic!("no worker node on port {port}"))
    }
}

/// The coordinator of a distributed install of two worker nodes, for a
/// suite run with [`crate::INSTALL_ENV`]`=citus`: `config`'s settings on
/// every node (Citus preloaded before pg_lease; the reaper off unless
/// `config` preloads pg_lease), `lease.distribute()` run. The worker nodes
/// stop with the coordinator.
pub(crate) fn distributed_install(config: &ClusterConfig) -> Cluster {
    let reaper = config
        .extra_conf
        .iter()
        .any(|line| line.contains("shared_preload_libraries") && line.contains(EXTENSION));
    let mut settings: Vec<&str> = config
        .extra_conf
        .iter()
        .map(String::as_str)
        .filter(|line| !line.contains("shared_preload_libraries"))
        .collect();
    if !reaper {
        settings.push("lease.reaper_enabled = off");
    }
    let CitusCluster {
        mut coordinator,
        workers,
    } = CitusCluster::start_with(2, Duration::from_secs(1), &settings);
    coordinator.psql(TEST_DB, "SELECT lease.distribute()");
    coordinator.nodes = workers;
    coordinator
}

/// A role `name` that logs in and is a member of `group`.
pub async fn login_role(su: &tokio_postgres::Client, name: &str, group: &str) {
    su.batch_execute(&format!("CREATE ROLE {name} LOGIN IN ROLE {group}"))
        .await
        .expect("create role");
}

/// The remote commands the coordinator logged (`citus.log_remote_commands`,
/// at NOTICE):
/// each command with the port of the node it went to.
pub fn remote_commands(coordinator: &Cluster) -> Vec<(String, u16)> {
    let log = coordinator.server_log();
    let mut lines = log.lines().peekable();
    let mut out = Vec::new();
    while let Some(line) = lines.next() {
        let Some((_, command)) = line.split_once("NOTICE:  issuing ") else {
            continue;
        };
        let port = lines
            .peek()
            .and_then(|detail| detail.rsplit_once("@127.0.0.1:"))
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .and_then(|port| port.parse().ok())
            .unwrap_or_else(|| panic!("no node after {line:?}"));
        out.push((command.to_owned(), port));
    }
    out
}
