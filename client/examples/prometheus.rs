//! The client's metrics (`pg_lease_client::metrics`) on a Prometheus
//! endpoint: `metrics-exporter-prometheus` records them, and a small HTTP
//! server answers `GET /metrics` with its rendering. A Worker drains 50
//! jobs (every tenth fails), then the example scrapes its own endpoint and
//! exits non-zero unless the counters it expects are there.
//!
//! ```sh
//! cargo run -p pg_lease_client --example prometheus -- "host=127.0.0.1 user=postgres dbname=app"
//! ```
//!
//! (or set `PG_LEASE_URL`; without either, a throwaway PostgreSQL 15 is
//! started). `PG_LEASE_METRICS_ADDR` picks the address (default
//! `127.0.0.1:0`, any free port); set `PG_LEASE_METRICS_LINGER=1` to keep
//! serving after the check.

use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use pg_lease_client::{BatchOptions, CancellationToken, Client, Outcome, Worker, WorkerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (_cluster, url) = pg_tests::example_database();

    // The recorder every `metrics::` call in the client reports to.
    let handle = PrometheusBuilder::new().install_recorder()?;
    let addr = std::env::var("PG_LEASE_METRICS_ADDR").unwrap_or_else(|_| "127.0.0.1:0".into());
    let listener = TcpListener::bind(&addr).await?;
    let endpoint = format!("http://{}/metrics", listener.local_addr()?);
    println!("Serving {endpoint}");
    tokio::spawn(serve(listener, handle));

    let client = Client::connect(&url).await?;
    client
        .create_queue("metrics_demo", &Default::default())
        .await?;
    let payloads: Vec<serde_json::Value> = (0..50).map(|n| serde_json::json!({ "n": n })).collect();
    client
        .enqueue_batch("metrics_demo", &payloads, &BatchOptions::default())
        .await?;
    let mut config = WorkerConfig::new("metrics_demo");
    config.concurrency = 4;
    let worker = Worker::new(client.clone(), config, |job| async move {
        tokio::time::sleep(Duration::from_millis(5)).await;
        if job.payload()["n"].as_i64().unwrap_or(0) % 10 == 9 {
            return Ok(Outcome::fail("every tenth job fails"));
        }
        Ok(Outcome::Done)
    });
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(worker.run(shutdown.clone()));
    // Until the queue is drained.
    loop {
        let stats = client.queue_stats().await?;
        let left = stats
            .iter()
            .find(|s| s.queue == "metrics_demo")
            .map(|s| s.pending + s.leased)
            .unwrap_or(0);
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    run.await??;

    let scraped = scrape(&endpoint).await?;
    let mut missing = Vec::new();
    for expected in [
        r#"pg_lease_jobs_total{queue="metrics_demo",event="claimed"} 50"#,
        r#"pg_lease_jobs_total{queue="metrics_demo",event="done"} 45"#,
        r#"pg_lease_jobs_total{queue="metrics_demo",event="failed"} 5"#,
        "pg_lease_handler_seconds",
        "pg_lease_claim_seconds",
        "pg_lease_claim_wait_seconds",
    ] {
        if !scraped.contains(expected) {
            missing.push(expected);
        }
    }
    println!("{scraped}");
    if !missing.is_empty() {
        return Err(format!("{endpoint} lacks {missing:?}").into());
    }
    println!("{endpoint} serves the Worker's metrics");
    if std::env::var("PG_LEASE_METRICS_LINGER").is_ok() {
        tokio::signal::ctrl_c().await?;
    }
    Ok(())
}

/// Answers every connection with the current rendering (HTTP/1.0, one
/// request per connection: all a Prometheus scrape needs).
async fn serve(listener: TcpListener, handle: PrometheusHandle) {
    while let Ok((mut stream, _)) = listener.accept().await {
        let body = handle.render();
        tokio::spawn(async move {
            let mut request = [0u8; 1024];
            let _ = stream.read(&mut request).await;
            let head = format!(
                "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(body.as_bytes()).await;
        });
    }
}

/// `GET` over plain TCP, as a scraper would; returns the body.
async fn scrape(endpoint: &str) -> Result<String, BoxError> {
    let rest = endpoint.trim_start_matches("http://");
    let (host, path) = rest.split_once('/').ok_or("bad endpoint")?;
    let mut stream = TcpStream::connect(host).await?;
    stream
        .write_all(format!("GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let (head, body) = response.split_once("\r\n\r\n").ok_or("no HTTP body")?;
    if !head.starts_with("HTTP/1.0 200") {
        return Err(format!("scrape answered {head}").into());
    }
    Ok(body.to_owned())
}
