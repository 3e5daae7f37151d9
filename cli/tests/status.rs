//! `status`, `watch`, `queues`, `stats`, `in-flight` and `sweep` against
//! real clusters, as tables and as JSON: what an operator looks at first.

mod common;

use std::time::Duration;

use common::{assert_exit, line_cells, pg_lease, pg_lease_json, stdout};
use pg_tests::{scalar, until, Cluster, ClusterConfig, TEST_DB};
use serde_json::Value;

/// The entry of `array` whose `key` is `value`.
fn find<'a>(array: &'a Value, key: &str, value: &str) -> &'a Value {
    array
        .as_array()
        .and_then(|a| a.iter().find(|v| v[key] == value))
        .unwrap_or_else(|| panic!("no {key} = {value:?} in {array}"))
}

/// Without a preloaded reaper: status shows the expired lease waiting, the
/// named lease's holder and that no reaper runs; `sweep` recovers the lease
/// (new epoch, pending again) and `queues` shows policies and counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_queues_and_a_sweep_by_hand() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute(
        "SELECT lease.create_queue('emails', max_attempts => 3);
         SELECT lease.create_queue('reports', jitter => 'none', retention => '1 hour');
         SELECT lease.grant('reports', 'lease_worker');
         SELECT lease.enqueue('emails', '{\"n\": 1}');
         SELECT lease.enqueue('emails', '{\"n\": 2}');
         SELECT lease.try_acquire('leader', 'node-1', '1 minute');",
    )
    .await
    .expect("setup");
    let (id, epoch): (i64, i64) = {
        let r = pg
            .query_one(
                "SELECT id, epoch FROM lease.claim_pending(1, '100 milliseconds', 'w1', 'emails')",
                &[],
            )
            .await
            .expect("claim");
        (r.get(0), r.get(1))
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let version: String = scalar(
        &pg,
        "SELECT extversion FROM pg_extension WHERE extname = 'pg_lease'",
    )
    .await;
    let url = cluster.conn_string(TEST_DB);
    status_before_the_sweep(&url, &version, id);

    sweep_recovers(&pg, &url, id, epoch).await;
    queues_show_policies(&url);
}

/// Before the sweep: the expired lease waits, no reaper runs, the leader
/// holds its named lease.
fn status_before_the_sweep(url: &str, version: &str, id: i64) {
    let status = pg_lease(url, &["status"]);
    assert_exit(&status, 0);
    let text = stdout(&status);
    assert!(
        text.starts_with(&format!("pg_lease {version} in database \"{TEST_DB}\"")),
        "{text}"
    );
    // queue, state, pending, ready, leased, expired
    assert_eq!(
        line_cells(&status, "emails")[..6],
        ["emails", "running", "1", "1", "1", "1"],
        "{text}"
    );
    assert!(
        line_cells(&status, "reaper").contains(&"not".to_owned()),
        "{text}"
    );
    assert_eq!(line_cells(&status, "expired")[1], "1", "{text}");
    assert_eq!(
        line_cells(&status, "leader")[..2],
        ["leader", "node-1"],
        "{text}"
    );

    let json = pg_lease_json(url, &["status"]);
    assert_eq!(json["database"], TEST_DB);
    assert_eq!(json["extension"]["installed"], version);
    assert_eq!(json["extension"]["available"], version);
    let emails = find(&json["queues"], "queue", "emails");
    assert_eq!(
        (emails["pending"].as_i64(), emails["expired"].as_i64()),
        (Some(1), Some(1))
    );
    assert_eq!(json["reaper"]["preloaded"], false);
    assert_eq!(json["reaper"]["expired_waiting"], 1);
    assert_eq!(json["reaper"]["last_sweep_at"], Value::Null);
    let leader = find(&json["holders"], "name", "leader");
    assert_eq!(leader["owner"], "node-1");
    assert!(leader["remaining_secs"]
        .as_f64()
        .is_some_and(|s| s > 30.0 && s <= 60.0));

    let leases = pg_lease_json(url, &["in-flight", "--queue", "emails"]);
    assert_eq!(leases[0]["id"], id);
    assert_eq!(leases[0]["owner"], "w1");
    assert_eq!(leases[0]["expired"], true);
}

/// `sweep` recovers the expired lease: new epoch, pending again.
async fn sweep_recovers(pg: &tokio_postgres::Client, url: &str, id: i64, epoch: i64) {
    let swept = pg_lease(url, &["sweep"]);
    assert_exit(&swept, 0);
    assert_eq!(
        line_cells(&swept, "emails")[..4],
        ["emails", "1", "0", "0"],
        "{swept:?}"
    );
    assert!(stdout(&swept).contains("0 rows purged"));
    let (state, new_epoch): (String, i64) = {
        let r = pg
            .query_one(
                &format!("SELECT state::text, epoch FROM lease.job WHERE id = {id}"),
                &[],
            )
            .await
            .expect("row");
        (r.get(0), r.get(1))
    };
    assert_eq!(state, "pending");
    assert!(new_epoch > epoch);
    // `reap` is the old name of the same command.
    let again = pg_lease_json(url, &["reap"]);
    assert_eq!(again, serde_json::json!({"reaped": [], "purged": 0}));
}

/// `queues`: policies and counts, as a table and as JSON.
fn queues_show_policies(url: &str) {
    let queues = pg_lease(url, &["queues"]);
    assert_exit(&queues, 0);
    let reports = line_cells(&queues, "reports").join(" ");
    assert!(
        reports.starts_with("reports running 25 1 s..1 h none 1 h 7 d granted 0"),
        "{reports}"
    );
    let queues = pg_lease_json(url, &["queues"]);
    let emails = find(&queues, "queue", "emails");
    assert_eq!(emails["max_attempts"], 3);
    assert_eq!(emails["backoff_base_secs"], 1.0);
    assert_eq!(emails["backoff_max_secs"], 3600.0);
    assert_eq!(emails["jitter"], "full");
    assert_eq!(emails["dead_retention_secs"], 604_800.0);
    assert_eq!(emails["restricted"], false);
    assert_eq!(emails["pending"], 2);
    let reports = find(&queues, "queue", "reports");
    assert_eq!(reports["jitter"], "none");
    assert_eq!(reports["retention_secs"], 3600.0);
    assert_eq!(reports["restricted"], true);

    // The recovered row waits out its backoff; the other one is ready.
    let stats = pg_lease_json(url, &["stats"]);
    let emails = find(&stats, "queue", "emails");
    assert_eq!(emails["pending"], 2);
    assert!(emails["oldest_ready_age_secs"].as_f64().is_some());
}

/// `watch` refreshes until its count: JSON Lines with --json, one screen
/// under the other otherwise; a count of 0 is a usage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_refreshes_until_its_count() {
    let cluster = Cluster::start();
    let url = cluster.conn_string(TEST_DB);

    let started = std::time::Instant::now();
    let out = pg_lease(
        &url,
        &["--json", "watch", "--interval", "0.3", "--count", "3"],
    );
    assert_exit(&out, 0);
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "two pauses between three refreshes"
    );
    let text = stdout(&out);
    let docs: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON document per line"))
        .collect();
    assert_eq!(docs.len(), 3, "{text}");
    for doc in &docs {
        assert_eq!(doc["database"], TEST_DB);
        assert!(doc["queues"].is_array() && doc["reaper"].is_object());
    }

    let out = pg_lease(&url, &["watch", "--count", "2", "--interval", "0.1"]);
    assert_exit(&out, 0);
    let text = stdout(&out);
    assert_eq!(text.matches("--- ").count(), 2, "{text}");
    assert_eq!(text.matches("\ndefault ").count(), 2, "{text}");

    assert_exit(&pg_lease(&url, &["watch", "--count", "0"]), 2);
    assert_exit(&pg_lease(&url, &["watch", "--interval", "0"]), 2);
}

/// With the reaper preloaded, status says so, and shows its sweeps once it
/// has recovered an expired lease by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_the_background_reaper_at_work() {
    let cluster = Cluster::start_with(ClusterConfig {
        extra_conf: vec!["shared_preload_libraries = 'pg_lease'".into()],
        ..Default::default()
    });
    let pg = cluster.connect().await;
    pg.batch_execute(
        "SELECT lease.enqueue('default', '{}');
         SELECT lease.claim_pending(1, '100 milliseconds', 'w', 'default');",
    )
    .await
    .expect("an expiring lease");
    let url = cluster.conn_string(TEST_DB);
    until(
        "the reaper recovers the lease",
        Duration::from_secs(30),
        || {
            let url = url.clone();
            async move {
                let json = pg_lease_json(&url, &["status"]);
                json["reaper"]["recovered"].as_i64() == Some(1)
            }
        },
    )
    .await;
    let json = pg_lease_json(&url, &["status"]);
    let reaper = &json["reaper"];
    assert_eq!(reaper["preloaded"], true);
    assert!(reaper["sweeps"].as_i64().is_some_and(|n| n >= 1));
    assert!(reaper["last_sweep_at"]
        .as_str()
        .is_some_and(|t| t.ends_with('Z')));
    assert!(reaper["last_duration_secs"].as_f64().is_some());
    assert_eq!(reaper["slot_shortages"], 0);
    assert_eq!(reaper["last_error"], Value::Null);
    let text = stdout(&pg_lease(&url, &["status"]));
    assert!(text.contains("preloaded: the server sweeps"), "{text}");
    assert!(text.contains("recovered 1 leases"), "{text}");
}
