//! `field-adapter`: pg_lease in the field's own long-horizon benchmark
//! (`bin/field-bench`), speaking the JSONL protocol of the harness's
//! `CONTRIBUTING_ADAPTERS.md`.
//!
//! It uses pg_lease as a service would: `Client::enqueue_batch` to produce,
//! and one [`Worker`] with the library's defaults but for its concurrency
//! (`WORKER_COUNT`) to consume. Each job's payload carries the wall-clock
//! time it was produced; the handler records now minus that as the pickup
//! latency, sleeps `JOB_WORK_MS`, and returns `Done`.
//!
//! Environment (set by the harness): `DATABASE_URL`, `PRODUCER_MODE`
//! (`fixed` or `depth-target`), `PRODUCER_RATE`, `PRODUCER_PACING`
//! (`harness` or `adapter`), `PRODUCER_BATCH_MAX`, `PRODUCER_BATCH_MS`,
//! `PRODUCER_RATE_CONTROL_FILE`, `TARGET_DEPTH`, `WORKER_COUNT`,
//! `JOB_PAYLOAD_BYTES`, `JOB_WORK_MS`, `SAMPLE_EVERY_S`,
//! `BENCH_INSTANCE_ID`. Only the `long_horizon` scenario exists.

mod producer;
mod telemetry;
mod window;

use std::error::Error;
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pg_lease_client::{CancellationToken, Client, Outcome, QueueOptions, Worker, WorkerConfig};
use tokio::signal::unix::{signal, SignalKind};

use producer::{Pacing, Producer};
use telemetry::{now_epoch_ms, now_iso, sample};
use window::LatencyWindow;

/// The one queue the benchmark uses.
pub const QUEUE: &str = "field_bench";

/// pg_lease's tables that churn under load (also in `adapter.json`).
const EVENT_TABLES: &[&str] = &["lease.job", "lease.counter", "lease.queue"];

/// The trailing window of the latency percentiles, as the contract says.
const LATENCY_WINDOW: Duration = Duration::from_secs(30);

type Res<T> = Result<T, Box<dyn Error + Send + Sync>>;

/// Counters the producer, the handlers and the sampler share.
pub struct Shared {
    pub enqueued: AtomicU64,
    pub completed: AtomicU64,
    /// Ready rows, as the depth poller last read them.
    pub depth: AtomicU64,
    pub pickup: Mutex<LatencyWindow>,
}

struct Settings {
    url: String,
    db_name: String,
    pacing: Pacing,
    batch_max: usize,
    workers: usize,
    payload_bytes: usize,
    work: Duration,
    sample_every: Duration,
    instance: u32,
}

fn env_or<T: FromStr>(name: &str, default: T) -> Res<T> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map_err(|_| format!("{name}={v:?} is not a valid value").into()),
        _ => Ok(default),
    }
}

impl Settings {
    fn from_env() -> Res<Settings> {
        let url = std::env::var("DATABASE_URL").map_err(|_| "DATABASE_URL is not set")?;
        let db_name = tokio_postgres::Config::from_str(&url)?
            .get_dbname()
            .unwrap_or("postgres")
            .to_owned();
        let scenario = env_or("SCENARIO", "long_horizon".to_owned())?;
        if scenario != "long_horizon" {
            return Err(format!("SCENARIO={scenario}: only long_horizon is implemented").into());
        }
        let batch_ms: u64 = env_or("PRODUCER_BATCH_MS", 25)?;
        let pacing = match env_or("PRODUCER_MODE", "fixed".to_owned())?.as_str() {
            "depth-target" => Pacing::DepthTarget {
                depth: env_or("TARGET_DEPTH", 1000)?,
            },
            "fixed" => match env_or("PRODUCER_PACING", "harness".to_owned())?.as_str() {
                "harness" => Pacing::Harness,
                "adapter" => Pacing::Adapter {
                    rate: env_or("PRODUCER_RATE", 800.0)?,
                    period: Duration::from_millis(batch_ms.max(1)),
                    control_file: std::env::var_os("PRODUCER_RATE_CONTROL_FILE").map(Into::into),
                },
                other => return Err(format!("PRODUCER_PACING={other} is unknown").into()),
            },
            other => return Err(format!("PRODUCER_MODE={other} is unknown").into()),
        };
        Ok(Settings {
            url,
            db_name,
            pacing,
            batch_max: env_or::<usize>("PRODUCER_BATCH_MAX", 128)?.max(1),
            workers: env_or::<usize>("WORKER_COUNT", 32)?.max(1),
            payload_bytes: env_or("JOB_PAYLOAD_BYTES", 256)?,
            work: Duration::from_millis(env_or("JOB_WORK_MS", 1)?),
            sample_every: Duration::from_secs(env_or::<u64>("SAMPLE_EVERY_S", 5)?.max(1)),
            instance: env_or("BENCH_INSTANCE_ID", 0)?,
        })
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("[pg_lease] field-adapter: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Res<()> {
    let settings = Settings::from_env()?;
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;

    let admin = Client::connect(&settings.url).await?;
    // Every replica may call it: it creates or updates the queue.
    admin.create_queue(QUEUE, &QueueOptions::default()).await?;
    telemetry::descriptor(&telemetry::Descriptor {
        db_name: &settings.db_name,
        event_tables: EVENT_TABLES,
        extension_version: &extension_version(&settings.url).await?,
    });

    let shared = Arc::new(Shared {
        enqueued: AtomicU64::new(0),
        completed: AtomicU64::new(0),
        depth: AtomicU64::new(0),
        pickup: Mutex::new(LatencyWindow::new(LATENCY_WINDOW)?),
    });
    let stop = CancellationToken::new();
    let worker = tokio::spawn(
        worker(&settings, Arc::clone(&shared))
            .await?
            .run(stop.clone()),
    );
    let producer = Producer {
        client: Client::connect(&settings.url).await?,
        pacing: settings.pacing.clone(),
        batch_max: settings.batch_max,
        padding: "x".repeat(settings.payload_bytes.saturating_sub(80)),
        name: format!("{}-{}", settings.instance, std::process::id()),
        shared: Arc::clone(&shared),
        next_seq: 0,
    };
    let producer = tokio::spawn(producer.run(stop.clone()));
    tokio::spawn(poll_depth(admin, Arc::clone(&shared), stop.clone()));
    let sampler = tokio::spawn(sampler(
        Arc::clone(&shared),
        settings.sample_every,
        settings.instance,
        stop.clone(),
    ));

    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    eprintln!("[pg_lease] field-adapter: stopping");
    stop.cancel();
    // The contract: exit within 5 s of SIGTERM. Jobs of 1 ms finish long
    // before; anything still out is given back by the Worker's drain.
    let _ = tokio::time::timeout(Duration::from_secs(4), async {
        let _ = producer.await;
        let _ = sampler.await;
        if let Ok(Err(e)) = worker.await {
            eprintln!("[pg_lease] worker: {e}");
        }
    })
    .await;
    Ok(())
}

/// The installed extension's version, for the descriptor.
async fn extension_version(url: &str) -> Res<String> {
    let (db, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let row = db
        .query_one(
            "SELECT extversion FROM pg_extension WHERE extname = 'pg_lease'",
            &[],
        )
        .await?;
    Ok(row.try_get(0)?)
}

/// The consumer: a `Worker` with the library's defaults, `WORKER_COUNT`
/// handlers at once.
async fn worker(settings: &Settings, shared: Arc<Shared>) -> Res<Worker> {
    let mut config = WorkerConfig::new(QUEUE);
    config.concurrency = settings.workers;
    let work = settings.work;
    let client = Client::connect(&settings.url).await?;
    Ok(Worker::new(client, config, move |job| {
        let shared = Arc::clone(&shared);
        async move {
            let produced = job.payload()["produced_at_ms"].as_i64().unwrap_or(0);
            let latency = u64::try_from(now_epoch_ms() - produced).unwrap_or(0);
            if let Ok(mut w) = shared.pickup.lock() {
                w.record(Duration::from_millis(latency));
            }
            if !work.is_zero() {
                tokio::time::sleep(work).await;
            }
            shared.completed.fetch_add(1, Ordering::Relaxed);
            Ok(Outcome::Done)
        }
    }))
}

/// Reads the ready depth five times a second (`lease.metrics`: counters,
/// not a count of rows), for the samples and the depth-target producer.
async fn poll_depth(client: Client, shared: Arc<Shared>, stop: CancellationToken) {
    while !stop.is_cancelled() {
        match client.metrics().await {
            Ok(queues) => {
                let ready = queues
                    .iter()
                    .filter(|q| q.queue == QUEUE)
                    .map(|q| q.ready)
                    .sum::<i64>();
                shared
                    .depth
                    .store(u64::try_from(ready).unwrap_or(0), Ordering::Relaxed);
            }
            Err(e) => eprintln!("[pg_lease] depth poll failed: {e}"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}

/// Emits the required metrics every `every`, on wall-clock boundaries, and
/// once more when stopped.
async fn sampler(shared: Arc<Shared>, every: Duration, instance: u32, stop: CancellationToken) {
    tokio::select! {
        _ = stop.cancelled() => return,
        _ = tokio::time::sleep(telemetry::until_next_boundary(every)) => {}
    }
    let mut last = (
        Instant::now(),
        shared.enqueued.load(Ordering::Relaxed),
        shared.completed.load(Ordering::Relaxed),
    );
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let stopping = tokio::select! {
            _ = stop.cancelled() => true,
            _ = tick.tick() => false,
        };
        let now = Instant::now();
        let (enqueued, completed) = (
            shared.enqueued.load(Ordering::Relaxed),
            shared.completed.load(Ordering::Relaxed),
        );
        let dt = now.duration_since(last.0).as_secs_f64().max(0.001);
        let t = now_iso();
        let window_s = every.as_secs_f64();
        let percentiles = shared.pickup.lock().ok().and_then(|mut w| w.percentiles());
        if let Some(p) = percentiles {
            for (metric, value) in [
                ("claim_p50_ms", p.p50),
                ("claim_p95_ms", p.p95),
                ("claim_p99_ms", p.p99),
            ] {
                sample(&t, instance, metric, value, LATENCY_WINDOW.as_secs_f64());
            }
        }
        sample(
            &t,
            instance,
            "enqueue_rate",
            (enqueued - last.1) as f64 / dt,
            window_s,
        );
        sample(
            &t,
            instance,
            "completion_rate",
            (completed - last.2) as f64 / dt,
            window_s,
        );
        let depth = shared.depth.load(Ordering::Relaxed) as f64;
        sample(&t, instance, "queue_depth", depth, 0.0);
        last = (now, enqueued, completed);
        if stopping {
            return;
        }
    }
}
