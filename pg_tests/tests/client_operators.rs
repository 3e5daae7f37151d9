// pg_tests: library only: it creates roles and grants, which the owner of the install without the library may not.
//! The client's calls for operators: per-queue grants, cancel by key,
//! requeue of dead letters, releasing many named leases at once, the
//! monitoring views, paging through rows, and the typed errors of their
//! refusals.

use std::time::Duration;

use pg_lease_client::{CancelResult, Client, Error, Outcome, QueueOptions};
use pg_tests::{Cluster, TEST_DB};
use serde_json::json;

fn conn(cluster: &Cluster, user: &str) -> String {
    format!(
        "host=127.0.0.1 port={} user={user} dbname={TEST_DB}",
        cluster.port()
    )
}

#[tokio::test]
async fn grants_keys_requeue_and_named_batches_through_the_client() {
    let cluster = Cluster::start();
    cluster.psql(
        TEST_DB,
        "CREATE ROLE ops LOGIN IN ROLE lease_admin; CREATE ROLE w LOGIN IN ROLE lease_worker;
         CREATE TABLE items (id int PRIMARY KEY, status text);
         SELECT lease.attach('items', $$status = 'todo'$$);",
    );
    let admin = Client::connect(&conn(&cluster, "ops"))
        .await
        .expect("admin");
    let worker = Client::connect(&conn(&cluster, "w")).await.expect("worker");
    admin
        .create_queue("jobs", &QueueOptions::default())
        .await
        .expect("queue");

    // A restricted queue does not exist for the worker until it is granted.
    admin.grant("jobs", "ops", true, true).await.expect("grant");
    let refused = worker
        .enqueue("jobs", &json!({}))
        .await
        .expect_err("restricted");
    assert!(
        matches!(&refused, Error::InvalidInput { code, .. } if code == "42704"),
        "{refused:?}"
    );
    admin.grant("jobs", "w", true, true).await.expect("grant w");
    let id = worker.enqueue("jobs", &json!({})).await.expect("granted");
    assert!(admin.revoke("jobs", "w").await.expect("revoke"));
    assert!(!admin.revoke("jobs", "w").await.expect("revoke again"));
    let unknown = admin
        .grant("jobs", "nobody", true, true)
        .await
        .expect_err("no such role");
    assert!(unknown.is_invalid_input(), "{unknown:?}");

    // Enqueue into an attached table's queue is bad input (42809).
    let attached = admin
        .enqueue("items", &json!({}))
        .await
        .expect_err("attached");
    assert!(attached.is_invalid_input(), "{attached:?}");

    // Cancel by key, and requeue of a dead letter.
    cluster.psql(TEST_DB, "INSERT INTO items VALUES (1, 'todo'), (2, 'todo')");
    assert_eq!(
        worker.cancel_key("items", "1").await.expect("cancel"),
        CancelResult::Cancelled
    );
    assert_eq!(
        worker.cancel_key("items", "9").await.expect("cancel"),
        CancelResult::NotFound
    );
    let claimed = admin
        .claim(1, Duration::from_secs(60), "a", "jobs")
        .await
        .expect("claim");
    let job = claimed.first().expect("one");
    assert_eq!(job.lease.id(), id);
    admin
        .release(&job.lease, &Outcome::fail("gave up"))
        .await
        .expect("fail");
    assert!(admin.requeue(id).await.expect("requeue"));
    assert!(!admin.requeue(id).await.expect("not dead any more"));
    assert_eq!(
        admin
            .claim(1, Duration::from_secs(60), "b", "jobs")
            .await
            .expect("claim")
            .len(),
        1
    );

    // Named leases released in one call.
    let e1 = worker
        .try_acquire("l1", "hk", Duration::from_secs(60))
        .await
        .expect("l1")
        .expect("held");
    let e2 = worker
        .try_acquire("l2", "hk", Duration::from_secs(60))
        .await
        .expect("l2")
        .expect("held");
    let released = worker
        .release_named_batch("hk", &[("l1", e1), ("l2", e2), ("l1", e1 - 1)])
        .await
        .expect("release many");
    assert_eq!(
        released,
        vec![
            ("l1".to_owned(), true),
            ("l2".to_owned(), true),
            ("l1".to_owned(), false)
        ]
    );

    // The batch form's former names still work for one release: the SQL
    // overload release_named(text[], ...) and the client's
    // release_named_many.
    let e3 = worker
        .try_acquire("l3", "hk", Duration::from_secs(60))
        .await
        .expect("l3")
        .expect("held");
    #[allow(deprecated)]
    let released = worker
        .release_named_many("hk", &[("l3", e3)])
        .await
        .expect("the deprecated name");
    assert_eq!(released, vec![("l3".to_owned(), true)]);
    let e4 = worker
        .try_acquire("l4", "hk", Duration::from_secs(60))
        .await
        .expect("l4")
        .expect("held");
    let via_sql = cluster.psql(
        TEST_DB,
        &format!(
            "SELECT released FROM lease.release_named(ARRAY['l4'], 'hk', ARRAY[{e4}::bigint])"
        ),
    );
    assert_eq!(via_sql.trim(), "t");
}

/// A `lease_admin` reads every monitoring view it is granted, through SQL
/// and through the client. Failed before the fix: `lease.reaper_stats`
/// calls two shared-memory readers (`_reaper_slot_shortages`,
/// `_reaper_last_slot_shortage`) that only the superuser could execute, so
/// the view granted to lease_admin raised 42501 for it (found by the
/// `pg-lease status` tests).
/// `lease.metrics` among them: it failed for `lease_admin` with 42501
/// ("permission denied for table job") as soon as a queue existed, because
/// its per-queue probe read `lease.job` with the reader's rights; found by
/// the dashboard's suite connecting as `lease_admin`.
#[tokio::test]
async fn an_admin_reads_every_monitoring_view() {
    let cluster = Cluster::start();
    cluster.psql(
        TEST_DB,
        "CREATE ROLE ops LOGIN IN ROLE lease_admin;
         SELECT lease.create_queue('q');
         SELECT lease.enqueue('q', '{}');
         SELECT lease.enqueue('q', '{}', run_at => now() + interval '1 hour');",
    );
    let ops = cluster.connect_to(TEST_DB, "ops").await;
    for view in [
        "metrics",
        "queue_stats",
        "in_flight",
        "dead_letters",
        "holders",
        "reaper_stats",
    ] {
        if let Err(e) = ops.query(&format!("SELECT * FROM lease.{view}"), &[]).await {
            panic!("lease_admin reading lease.{view}: {e:?}");
        }
    }
    let admin = Client::connect(&conn(&cluster, "ops"))
        .await
        .expect("admin");
    let stats = admin
        .reaper_stats()
        .await
        .expect("reaper_stats as lease_admin");
    assert_eq!(stats.sweeps, 0, "no reaper in this cluster: {stats:?}");
    let metrics = admin.metrics().await.expect("metrics as lease_admin");
    let q = metrics.iter().find(|m| m.queue == "q").expect("queue q");
    assert_eq!((q.ready, q.delayed), (1, 1), "{q:?}");
}

/// The views' read_ functions (what the client and the CLI read) answer
/// exactly the roles that may read the view itself: lease_admin, a role
/// with `pg_read_all_data`, a role granted SELECT on that one view; a
/// lease_worker and a role with only CREATEDB get 42501 and no rows.
///
/// Fails on the code that granted them to lease_admin alone: the read-only
/// role that could read `lease.metrics` could no longer load the
/// dashboard (found by its suite, `a_role_without_the_grant_sees_the_refusal`).
#[tokio::test]
async fn the_read_functions_answer_whoever_may_read_the_view() {
    let cluster = Cluster::start();
    cluster.psql(
        TEST_DB,
        "CREATE ROLE ops LOGIN IN ROLE lease_admin;
         CREATE ROLE viewer LOGIN IN ROLE pg_read_all_data;
         CREATE ROLE gauge LOGIN;
         GRANT USAGE ON SCHEMA lease TO gauge; GRANT SELECT ON lease.metrics TO gauge;
         CREATE ROLE w LOGIN IN ROLE lease_worker;
         CREATE ROLE nosy LOGIN CREATEDB;
         SELECT lease.create_queue('q');
         SELECT lease.enqueue('q', '{}');",
    );
    let reads = [
        ("lease.metrics", "SELECT count(*) FROM lease.read_metrics()"),
        (
            "lease.queue_stats",
            "SELECT count(*) FROM lease.read_queue_stats()",
        ),
        (
            "lease.in_flight",
            "SELECT count(*) FROM lease.read_in_flight('q')",
        ),
        (
            "lease.dead_letters",
            "SELECT count(*) FROM lease.read_dead_letters(NULL, 10)",
        ),
    ];
    for role in ["ops", "viewer", "gauge", "w", "nosy"] {
        let pg = cluster.connect_to(TEST_DB, role).await;
        for (view, read) in reads {
            let may = match role {
                "ops" | "viewer" => true,
                "gauge" => view == "lease.metrics",
                _ => false,
            };
            match pg.query_one(read, &[]).await {
                Ok(_) => assert!(may, "{role} read {view}"),
                Err(e) => {
                    assert!(!may, "{role} reading {view}: {e:?}");
                    assert_eq!(
                        e.code(),
                        Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
                        "{role}, {view}: {e:?}"
                    );
                }
            }
        }
    }
    let gauge = Client::connect(&conn(&cluster, "gauge"))
        .await
        .expect("gauge");
    let metrics = gauge.metrics().await.expect("metrics as its reader");
    assert!(metrics.iter().any(|m| m.queue == "q" && m.ready == 1));
}

/// `Client::jobs` pages by id (each page starts after the last id of the
/// one before) and finds a key through its queue; a key without a queue is
/// refused before anything is sent. New with the dashboard's paging.
#[tokio::test]
async fn jobs_page_by_id_and_find_a_key_within_its_queue() {
    let cluster = Cluster::start();
    let client = Client::connect(&cluster.conn_string(TEST_DB))
        .await
        .expect("client");
    for q in ["q", "other"] {
        client
            .create_queue(q, &QueueOptions::default())
            .await
            .expect("queue");
    }
    let mut ids = Vec::new();
    for n in 0..7 {
        let options = pg_lease_client::EnqueueOptions {
            key: Some(format!("k{n}")),
            ..Default::default()
        };
        ids.push(
            client
                .enqueue_with("q", &json!({ "n": n }), &options)
                .await
                .expect("enqueue"),
        );
        client
            .enqueue("other", &json!({}))
            .await
            .expect("enqueue other");
    }
    let mut filter = pg_lease_client::JobFilter {
        queue: Some("q".into()),
        limit: 3,
        ..Default::default()
    };
    let mut seen = Vec::new();
    loop {
        let page = client.jobs(&filter).await.expect("page");
        seen.extend(page.iter().map(|j| j.id));
        match page.last() {
            Some(last) if page.len() == 3 => filter.after = Some(last.id),
            _ => break,
        }
    }
    assert_eq!(seen, ids, "three pages, every row of q once, in id order");

    let by_key = |key: &str, state, after| pg_lease_client::JobFilter {
        queue: Some("q".into()),
        key: Some(key.into()),
        state,
        after,
        ..Default::default()
    };
    let found = client.jobs(&by_key("k4", None, None)).await.expect("key");
    assert_eq!(found.iter().map(|j| j.id).collect::<Vec<_>>(), vec![ids[4]]);
    let pending = Some(pg_lease_client::JobState::Pending);
    assert_eq!(
        client
            .jobs(&by_key("k4", pending, None))
            .await
            .expect("key")
            .len(),
        1
    );
    let dead = Some(pg_lease_client::JobState::Dead);
    assert!(client
        .jobs(&by_key("k4", dead, None))
        .await
        .expect("key")
        .is_empty());
    assert!(client
        .jobs(&by_key("k4", None, Some(ids[4])))
        .await
        .expect("key")
        .is_empty());
    assert!(client
        .jobs(&by_key("nope", None, None))
        .await
        .expect("key")
        .is_empty());

    let no_queue = pg_lease_client::JobFilter {
        key: Some("k4".into()),
        ..Default::default()
    };
    match client.jobs(&no_queue).await {
        Err(Error::InvalidInput { code, .. }) => assert_eq!(code, "client"),
        other => panic!("a key without a queue: {other:?}"),
    }
}

/// A page of a queue's rows in a rare state (leased, dead, cancelled) or
/// in the pending state reads about a page, not the queue: the queue holds
/// 20,000 pending rows, then 20,000 done rows it keeps (`retention`), then
/// the rare ones. Failed twice before: the client's statement compared
/// `state::text`, which no index serves (a page of the dead rows was a scan
/// of the table), and then, comparing with literals, the dead and cancelled
/// rows could only be found among every finished row (`job_finished`) or
/// by walking the primary key past all the others (20,180 rows read).
/// The dead-letter listing is held to the same.
/// `done` is left out: its rows are found by walking the primary key or
/// the finished rows, which costs a page only where done rows are common.
/// Each page's plan comes from the server log (`auto_explain` in the
/// client's session), with enough calls that a generic plan would show.
#[tokio::test]
async fn a_page_in_one_state_reads_a_page_not_the_queue() {
    const ROWS: i64 = 20_000;
    let cluster = Cluster::start();
    cluster.psql(
        TEST_DB,
        &format!(
            "SELECT lease.create_queue('big', retention => '1 day');
             SELECT lease.enqueue_batch('big', array_agg(jsonb_build_object('n', g)))
               FROM generate_series(1, {ROWS}) g;
             SELECT lease.enqueue_batch('big', array_agg('{{}}'::jsonb), priority => 5)
               FROM generate_series(1, {ROWS});
             SELECT count(*) FROM lease.claim_pending(10000, '1 hour', 'd', 'big') c,
                    LATERAL lease.release(c.id, 'd', c.epoch, 'done') r;
             SELECT count(*) FROM lease.claim_pending(10000, '1 hour', 'd', 'big') c,
                    LATERAL lease.release(c.id, 'd', c.epoch, 'done') r;
             SELECT lease.enqueue_batch('big', array_agg('{{}}'::jsonb), priority => 9)
               FROM generate_series(1, 180);
             SELECT count(*) FROM lease.claim_pending(60, '1 hour', 'w', 'big');
             SELECT count(*) FROM lease.claim_pending(60, '1 hour', 'x', 'big') c,
                    LATERAL lease.release(c.id, 'x', c.epoch, 'fail') r;
             SELECT count(lease.cancel(id)) FROM lease.job
              WHERE queue = 'big' AND state = 'pending' AND priority = 9;
             ANALYZE lease.job;"
        ),
    );
    let explained = format!(
        "{} options='-c session_preload_libraries=auto_explain \
         -c auto_explain.log_min_duration=0 -c auto_explain.log_analyze=on'",
        conn(&cluster, "postgres")
    );
    let client = Client::connect(&explained).await.expect("client");
    use pg_lease_client::JobState::*;
    for state in [Pending, Leased, Dead, Cancelled] {
        for _ in 0..7 {
            let mut filter = pg_lease_client::JobFilter {
                queue: Some("big".into()),
                state: Some(state),
                limit: 50,
                ..Default::default()
            };
            let first = client.jobs(&filter).await.expect("page 1");
            assert_eq!(first.len(), 50, "{state:?}");
            assert!(first.iter().all(|j| j.state == state));
            filter.after = first.last().map(|j| j.id);
            client.jobs(&filter).await.expect("page 2");
        }
    }
    for _ in 0..7 {
        let dead = client.dead_letters(Some("big"), 50).await.expect("dead");
        assert_eq!(dead.len(), 50);
    }
    let log = cluster.server_log();
    let plans = log.matches("Query Text:").count();
    assert!(plans >= 63, "{plans} plans logged");
    // The most rows any node of a plan handled or dropped.
    let rows = |plan: &str| {
        plan.lines()
            .flat_map(|l| {
                let produced = l
                    .split("actual time=")
                    .nth(1)
                    .and_then(|t| t.split(" rows=").nth(1))
                    .and_then(|n| n.split(' ').next());
                let dropped = l.trim().strip_prefix("Rows Removed by Filter: ");
                [produced, dropped]
            })
            .flatten()
            .filter_map(|n| n.trim().parse::<i64>().ok())
            .max()
            .unwrap_or(0)
    };
    let worst = log
        .split("Query Text:")
        .max_by_key(|plan| rows(plan))
        .unwrap_or("");
    assert!(
        rows(worst) < 1_000,
        "a page read {} rows of a queue of {}:\n{worst}",
        rows(worst),
        2 * ROWS + 180
    );
}
