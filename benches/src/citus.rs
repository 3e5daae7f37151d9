//! The `citus` section: pg_lease on Citus (`lease.distribute()`), every
//! call through the coordinator and forwarded to the node holding its
//! queue. Two comparisons, each side by side in one run:
//!
//! * one queue drained by one `Worker` with the library's defaults, on a
//!   plain node and on a coordinator with two worker nodes;
//! * sixteen queues, one `Worker` each, spread over two worker nodes and
//!   held by one.
//!
//! Every node (and the plain one) has the same settings, [`settings`]; the
//! CPU time each node's processes used says what bounds a drain on this
//! machine, whose cores all of them share.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pg_lease_client::{CancellationToken, Client, Outcome, QueueOptions, Worker, WorkerConfig};
use pg_tests::citus::{citus_available, CitusCluster};
use pg_tests::{Cluster, ClusterConfig, TEST_DB};

use crate::cpu::Cpu;
use crate::report::{rate, ratio, Results, Table};
use crate::scenarios::{connect, Res, Size};

/// The settings of every node of this section: the benchmark's, with less
/// shared memory (four servers share the machine) and without its preload
/// line (the Citus nodes preload `citus,pg_lease`, the plain node
/// `pg_lease`).
fn settings() -> Vec<String> {
    pg_lease_benches::SETTINGS
        .iter()
        .filter(|s| !s.starts_with("shared_buffers") && !s.starts_with("shared_preload_libraries"))
        .map(|s| (*s).to_owned())
        .chain(["shared_buffers = 256MB".to_owned()])
        .collect()
}

/// Queues of the spread-out drain.
const QUEUES: usize = 16;

/// Pairs of one-queue drains (plain node, then Citus): the ratio of a
/// single pair varied from 0.50 to 0.82 between runs of one day, the plain
/// node's drain alone by 1.4×.
const PAIRS: usize = 3;

/// One drain: its rate and the CPU seconds each node's processes used
/// (coordinator first on Citus).
struct Drained {
    rate: f64,
    node_cpu: Vec<f64>,
    client_cpu: f64,
}

impl Drained {
    fn cpu_cell(&self) -> String {
        let nodes: Vec<String> = self.node_cpu.iter().map(|c| format!("{c:.1}")).collect();
        format!("{} / {:.1}", nodes.join(" + "), self.client_cpu)
    }
}

/// Runs the section, or notes why it could not.
pub async fn citus(size: &Size, out: &mut Results) -> Res<()> {
    let mut t = Table::new(
        "pg_lease on Citus",
        "`Worker`s with the library's defaults (one per queue, no-op jobs) drain rows enqueued \
         beforehand with `enqueue_batch`, through the coordinator; every call is forwarded to the \
         node holding its queue. Plain node and Citus nodes alike: the settings above with \
         `shared_buffers = 256MB`; Citus 13.2.2, coordinator and workers on this machine, sharing \
         its cores. One queue: three pairs of drains (plain node, then Citus, on new clusters), \
         the pair with the middle ratio shown and the range of the three in brackets. CPU: \
         seconds used by each server's processes (coordinator first) / by this process.",
        &[
            "drain",
            "rows",
            "jobs/s",
            "ratio",
            "server CPU s / client CPU s",
        ],
    );
    if !citus_available() {
        t.row(vec![
            "SKIPPED: no Citus for this PostgreSQL (bin/prereqs builds it)".to_owned(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
        ]);
        out.tables.push(t);
        return Ok(());
    }
    // Drains of a second or more: a tenth of these rows drained in under
    // one, and the ratios of two runs differed by 0.3.
    let rows = size.worker_rows / 2;

    // Pairs of drains, plain node then Citus, each on new clusters; the
    // pair with the median ratio is shown, with the range of all.
    let mut pairs = Vec::with_capacity(PAIRS);
    for _ in 0..PAIRS {
        let plain = on_plain(rows).await?;
        let citus = on_citus(2, &["q"], rows).await?;
        pairs.push((plain, citus));
    }
    let pair_ratio = |p: &(Drained, Drained)| p.1.rate / p.0.rate;
    pairs.sort_by(|a, b| pair_ratio(a).total_cmp(&pair_ratio(b)));
    let range = format!(
        " (of {PAIRS}: {:.2}–{:.2})",
        pairs.first().map_or(0.0, pair_ratio),
        pairs.last().map_or(0.0, pair_ratio)
    );
    let (one_plain, one_citus) = &pairs[PAIRS / 2];
    let names: Vec<String> = (0..QUEUES).map(|i| format!("q{i:02}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let spread_one = on_citus(1, &names, rows * 2).await?;
    let spread_two = on_citus(2, &names, rows * 2).await?;

    let mut add = |label: &str, rows: u64, d: &Drained, against: Option<&Drained>, note: &str| {
        t.row(vec![
            label.to_owned(),
            rows.to_string(),
            rate(d.rate),
            against.map_or("1.00×".to_owned(), |a| ratio(d.rate / a.rate)) + note,
            d.cpu_cell(),
        ]);
    };
    add("1 queue, plain node", rows, one_plain, None, "");
    add(
        "1 queue, Citus (2 workers)",
        rows,
        one_citus,
        Some(one_plain),
        &range,
    );
    add(
        "16 queues, Citus, 1 worker node",
        rows * 2,
        &spread_one,
        None,
        "",
    );
    add(
        "16 queues, Citus, 2 worker nodes",
        rows * 2,
        &spread_two,
        Some(&spread_one),
        "",
    );
    out.tables.push(t);
    Ok(())
}

/// Drains one queue of `rows` on a new plain node with [`settings`].
async fn on_plain(rows: u64) -> Res<Drained> {
    let plain = Cluster::start_with(ClusterConfig {
        extra_conf: settings()
            .into_iter()
            .chain(["shared_preload_libraries = 'pg_lease'".to_owned()])
            .collect(),
        create_extension: true,
        sweep_every: None,
    });
    drain(&[&plain], &plain.conn_string(TEST_DB), &["q"], rows).await
}

/// Drains `queues` (`rows` over them) on a new distributed install of a
/// coordinator and `workers` worker nodes with [`settings`], through the
/// coordinator: each drain on a cluster of its own, so that none finds
/// another's dead rows.
async fn on_citus(workers: usize, queues: &[&str], rows: u64) -> Res<Drained> {
    let settings = settings();
    let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
    let citus = CitusCluster::start_with(workers, Duration::from_secs(1), &settings);
    let coordinator = citus.coordinator.conn_string(TEST_DB);
    connect(&coordinator)
        .await?
        .batch_execute("SELECT lease.distribute()")
        .await
        .map_err(|e| format!("distribute: {e}"))?;
    let nodes: Vec<&Cluster> = std::iter::once(&citus.coordinator)
        .chain(&citus.workers)
        .collect();
    drain(&nodes, &coordinator, queues, rows).await
}

/// Creates `queues` on the cluster behind `conn`, enqueues `rows` over
/// them, and drains them with one default `Worker` per queue; `nodes` are
/// the servers whose CPU is read.
async fn drain(nodes: &[&Cluster], conn: &str, queues: &[&str], rows: u64) -> Res<Drained> {
    let client = Client::connect(conn).await.map_err(|e| e.to_string())?;
    let per_queue = rows / queues.len() as u64;
    let payloads = vec![serde_json::json!({}); 1000];
    for q in queues {
        client
            .create_queue(q, &QueueOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        let mut left = per_queue;
        while left > 0 {
            let n = usize::try_from(left.min(1000)).unwrap_or(1000);
            client
                .enqueue_batch(q, &payloads[..n], &Default::default())
                .await
                .map_err(|e| e.to_string())?;
            left -= n as u64;
        }
    }
    let total = per_queue * queues.len() as u64;
    let mut postmasters = Vec::new();
    for node in nodes {
        postmasters.push(postmaster(&node.conn_string(TEST_DB)).await?);
    }
    let before: Vec<Cpu> = postmasters.iter().map(|p| Cpu::now(*p)).collect();

    let handled = Arc::new(AtomicU64::new(0));
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let mut runs = Vec::new();
    for q in queues {
        let worker_client = Client::connect(conn).await.map_err(|e| e.to_string())?;
        let counter = Arc::clone(&handled);
        let worker = Worker::new(worker_client, WorkerConfig::new(*q), move |_job| {
            let counter = Arc::clone(&counter);
            async move {
                counter.fetch_add(1, Ordering::Relaxed);
                Ok(Outcome::Done)
            }
        });
        runs.push(tokio::spawn(worker.run(shutdown.clone())));
    }
    let admin = connect(conn).await?;
    let deadline = started + Duration::from_secs(600);
    loop {
        if Instant::now() > deadline {
            return Err(format!(
                "drain of {total} rows over {queues:?} took over 600 s"
            ));
        }
        if handled.load(Ordering::Relaxed) >= total {
            let left: i64 = admin
                .query_one("SELECT count(*) FROM lease.job", &[])
                .await
                .map_err(|e| e.to_string())?
                .get(0);
            if left == 0 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    shutdown.cancel();
    for run in runs {
        run.await
            .map_err(|e| format!("worker task: {e}"))?
            .map_err(|e| e.to_string())?;
    }
    drop(admin);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after: Vec<Cpu> = postmasters.iter().map(|p| Cpu::now(*p)).collect();
    Ok(Drained {
        rate: total as f64 / secs,
        node_cpu: after
            .iter()
            .zip(&before)
            .map(|(a, b)| (*a - *b).server)
            .collect(),
        client_cpu: after
            .first()
            .zip(before.first())
            .map_or(0.0, |(a, b)| (*a - *b).client),
    })
}

/// The postmaster's pid of the server behind `conn`: its backend's parent.
async fn postmaster(conn: &str) -> Res<u32> {
    let pid: i32 = connect(conn)
        .await?
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .map_err(|e| e.to_string())?
        .get(0);
    crate::cpu::parent_of(u32::try_from(pid).map_err(|e| e.to_string())?)
}
