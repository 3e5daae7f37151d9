//! Attached tables under the writes their owners' other code makes: a
//! user's cancel or an acknowledgement consumer writing the domain row
//! while its lease holder writes it under `lease.fence`, and completions
//! that would leave a matching row without a lease.
//!
//! Each test failed before its fix (named in its doc comment).

use std::time::Duration;

use pg_tests::{scalar, sqlstate, Cluster};
use tokio_postgres::Client;

/// `items` attached with status validating / in_progress as the predicate.
async fn items(pg: &Client) {
    pg.batch_execute(
        "CREATE TABLE items (id text PRIMARY KEY, status text NOT NULL, progress int DEFAULT 0);
         SELECT lease.attach('items', $$status IN ('validating', 'in_progress')$$);",
    )
    .await
    .expect("items");
}

/// The deadlock of the attached-tables issue, 25 times over: the holder
/// fences and then writes its row while a user's cancel moves the same row
/// out of the predicate. On main `fence` locked the lease row first and the
/// cancel's trigger waited for it while holding the domain row, so one side
/// died with 40P01 (every round). Now `fence` takes the domain row first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_write_and_a_cancel_never_deadlock() {
    let cluster = Cluster::start();
    let setup = cluster.connect().await;
    items(&setup).await;
    let holder = cluster.connect().await;
    for round in 0..25 {
        let key = format!("b{round}");
        setup
            .execute("INSERT INTO items VALUES ($1, 'validating')", &[&key])
            .await
            .expect("insert");
        let row = holder
            .query_one(
                "SELECT id, epoch FROM lease.claim_pending(1, '1 minute', 'a', 'items')",
                &[],
            )
            .await
            .expect("claim");
        let (id, epoch): (i64, i64) = (row.get(0), row.get(1));
        holder.batch_execute("BEGIN").await.expect("begin");
        holder
            .execute("SELECT lease.fence($1, $2)", &[&id, &epoch])
            .await
            .expect("fence");
        let canceller = cluster.connect().await;
        let cancel_key = key.clone();
        let cancel = tokio::spawn(async move {
            canceller
                .execute(
                    "UPDATE items SET status = 'cancelled' WHERE id = $1",
                    &[&cancel_key],
                )
                .await
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        let wrote = holder
            .execute("UPDATE items SET progress = 40 WHERE id = $1", &[&key])
            .await;
        let committed = holder.batch_execute("COMMIT").await;
        let cancelled = cancel.await.expect("task");
        for (what, err) in [
            ("holder write", wrote.err()),
            ("holder commit", committed.err()),
            ("cancel", cancelled.err()),
        ] {
            if let Some(err) = err {
                panic!(
                    "round {round}: {what} failed with {:?}: {err}",
                    sqlstate(&err)
                );
            }
        }
        let status: String = scalar(
            &setup,
            &format!("SELECT status || ':' || progress FROM items WHERE id = '{key}'"),
        )
        .await;
        assert_eq!(status, "cancelled:40", "round {round}");
    }
}

/// Silent stranding: `release(..., 'done')` (what `Outcome::Done` sends) on
/// an attached row whose predicate still held deleted its lease row, and
/// the domain row, still matching, was never claimable again nor shown
/// anywhere. Now it becomes a dead letter, visible in `lease.dead_letters`,
/// and stays until the domain row moves on.
#[tokio::test]
async fn a_done_release_of_a_still_matching_row_is_a_visible_dead_letter() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    items(&pg).await;
    pg.batch_execute("INSERT INTO items VALUES ('s1', 'validating'), ('s2', 'validating')")
        .await
        .expect("insert");
    let claimed = pg
        .query(
            "SELECT id, epoch FROM lease.claim_pending(2, '1 minute', 'a', 'items')",
            &[],
        )
        .await
        .expect("claim");
    let (ids, epochs): (Vec<i64>, Vec<i64>) = claimed
        .iter()
        .map(|r| (r.get::<_, i64>(0), r.get::<_, i64>(1)))
        .unzip();
    assert!(
        scalar::<bool>(
            &pg,
            &format!("SELECT lease.release({}, 'a', {})", ids[0], epochs[0])
        )
        .await
    );
    pg.execute(
        "SELECT * FROM lease.release_batch(ARRAY[$1::bigint], 'a', ARRAY[$2::bigint])",
        &[&ids[1], &epochs[1]],
    )
    .await
    .expect("release_batch");
    pg.batch_execute("SELECT lease.purge()")
        .await
        .expect("purge");
    let dead: i64 = scalar(
        &pg,
        "SELECT count(*) FROM lease.dead_letters WHERE queue = 'items'",
    )
    .await;
    assert_eq!(dead, 2, "both rows are visible dead letters, purge or not");
    // When the domain moves the row on, its dead letter goes with it.
    pg.batch_execute("UPDATE items SET status = 'done' WHERE id = 's1'")
        .await
        .expect("domain write");
    let left: i64 = scalar(&pg, "SELECT count(*) FROM lease.job WHERE queue = 'items'").await;
    assert_eq!(left, 1);
}

/// What the source systems lacked: cancel by domain key (a lease_worker
/// cannot look up the id of a pending row), requeue of dead letters, and
/// releasing many named leases at once.
#[tokio::test]
async fn cancel_by_key_requeue_and_batch_named_release() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    items(&pg).await;
    pg.batch_execute("INSERT INTO items VALUES ('k1', 'validating'), ('k2', 'validating')")
        .await
        .expect("rows");
    // The operator's (in SQL mode the test role may not create roles).
    cluster
        .connect_to(pg_tests::TEST_DB, pg_tests::SUPERUSER)
        .await
        .batch_execute("CREATE ROLE w LOGIN IN ROLE lease_worker")
        .await
        .expect("role");
    let w = cluster.connect_to(pg_tests::TEST_DB, "w").await;
    let cancelled: String = scalar(&w, "SELECT lease.cancel_key('items', 'k1')").await;
    assert_eq!(cancelled, "cancelled");
    let none: Option<String> = scalar(&w, "SELECT lease.cancel_key('items', 'nope')").await;
    assert_eq!(none, None);

    // k2 fails for good, then an operator requeues it.
    let row = pg
        .query_one(
            "SELECT id, epoch FROM lease.claim_pending(1, '1 minute', 'a', 'items')",
            &[],
        )
        .await
        .expect("claim k2");
    let (id, epoch): (i64, i64) = (row.get(0), row.get(1));
    assert!(
        scalar::<bool>(
            &pg,
            &format!("SELECT lease.release({id}, 'a', {epoch}, 'fail')")
        )
        .await
    );
    assert!(scalar::<bool>(&pg, &format!("SELECT lease.requeue({id})")).await);
    assert!(
        !scalar::<bool>(&pg, &format!("SELECT lease.requeue({id})")).await,
        "only dead rows"
    );
    let again: i64 = scalar(
        &pg,
        "SELECT epoch FROM lease.claim_pending(1, '1 minute', 'b', 'items') WHERE key = 'k2'",
    )
    .await;
    assert!(again > epoch, "a new claim, a greater epoch");

    let e1: i64 = scalar(&w, "SELECT lease.try_acquire('lock-1', 'hk', '1 minute')").await;
    let e2: i64 = scalar(&w, "SELECT lease.try_acquire('lock-2', 'hk', '1 minute')").await;
    let released: String = scalar(
        &w,
        &format!(
            "SELECT string_agg(name || '=' || released, ',')
               FROM lease.release_named_batch(ARRAY['lock-1', 'lock-2', 'lock-1'], 'hk', ARRAY[{e1}, {e2}, {e1} - 1])"
        ),
    )
    .await;
    assert_eq!(released, "lock-1=true,lock-2=true,lock-1=false");
    let code = w
        .batch_execute("SELECT lease.release_named_batch(ARRAY['a'], 'hk', ARRAY[1, 2])")
        .await
        .expect_err("lengths differ");
    assert_eq!(sqlstate(&code).as_deref(), Some("22023"));
}

/// The heartbeat's deadlock: `renew_batch` locked its leases one by one
/// while an acknowledgement consumer, in one transaction, moved several
/// rows out of the predicate in another order (each trigger removing a
/// lease row); each waited for the other and one died with 40P01 (every
/// round before the fix). Now a heartbeat skips rows locked by others
/// and reports them busy (held NULL, not extended).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_and_a_consumer_never_deadlock() {
    let cluster = Cluster::start();
    let setup = cluster.connect().await;
    items(&setup).await;
    let heartbeat = cluster.connect().await;
    let consumer = cluster.connect().await;
    for round in 0..10 {
        let (a, b) = (format!("a{round}"), format!("b{round}"));
        setup
            .execute(
                "INSERT INTO items VALUES ($1, 'validating'), ($2, 'validating')",
                &[&a, &b],
            )
            .await
            .expect("insert");
        let rows = heartbeat
            .query(
                "SELECT id, epoch FROM lease.claim_pending(2, '1 minute', 'w', 'items') ORDER BY id",
                &[],
            )
            .await
            .expect("claim");
        let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
        let epochs: Vec<i64> = rows.iter().map(|r| r.get(1)).collect();
        // The consumer acknowledges the second row first...
        consumer.batch_execute("BEGIN").await.expect("begin");
        consumer
            .execute("UPDATE items SET status = 'acked' WHERE id = $1", &[&b])
            .await
            .expect("ack b");
        // ...while the heartbeat renews both, in id order...
        let hb = cluster.connect().await;
        let hb_pid: i32 = scalar(&hb, "SELECT pg_backend_pid()").await;
        let renew = {
            let (ids, epochs) = (ids.clone(), epochs.clone());
            tokio::spawn(async move {
                hb.query(
                    "SELECT held FROM lease.renew_batch($1, 'w', $2, '1 minute')",
                    &[&ids, &epochs],
                )
                .await
            })
        };
        // Until the heartbeat's statement runs (or ran): on a loaded machine
        // a fixed pause let the consumer commit first, and both leases were
        // simply gone.
        while !renew.is_finished()
            && !scalar::<bool>(
                &setup,
                &format!(
                    "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = {hb_pid} \
                      AND state = 'active' AND query LIKE '%renew_batch%')"
                ),
            )
            .await
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        // ...and then the first.
        let acked = consumer
            .execute("UPDATE items SET status = 'acked' WHERE id = $1", &[&a])
            .await;
        let committed = consumer.batch_execute("COMMIT").await;
        let renewed = renew.await.expect("task");
        for (what, err) in [
            ("consumer", acked.as_ref().err()),
            ("commit", committed.as_ref().err()),
            ("heartbeat", renewed.as_ref().err()),
        ] {
            if let Some(err) = err {
                panic!(
                    "round {round}: {what} failed with {:?}: {err}",
                    sqlstate(err)
                );
            }
        }
        let held: Vec<Option<bool>> = renewed.expect("renewed").iter().map(|r| r.get(0)).collect();
        assert_eq!(
            held[1], None,
            "round {round}: the locked row is busy, not lost"
        );
        let left: i64 = scalar(
            &setup,
            "SELECT count(*) FROM lease.job WHERE queue = 'items'",
        )
        .await;
        assert_eq!(
            left, 0,
            "round {round}: both acknowledged rows lost their leases"
        );
    }
}

/// Domain-driven order: a batch processor claims items by SLO deadline (to
/// the microsecond), set at attach for existing rows, on insert for new
/// ones, and moved when a pending item's deadline changes. Before,
/// attach had no order_by and claims followed insertion order.
#[tokio::test]
async fn claims_follow_the_order_by_column() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute(
        "CREATE TABLE slo_items (id int PRIMARY KEY, status text, deadline timestamptz, note text);
         INSERT INTO slo_items VALUES
             (1, 'todo', '2030-01-01 00:00:00.000003+00', 'x'),
             (2, 'todo', '2030-01-01 00:00:00.000001+00', 'x');
         SELECT lease.attach('slo_items', $$status = 'todo'$$, order_by => 'deadline');
         INSERT INTO slo_items VALUES
             (3, 'todo', '2030-01-01 00:00:00.000002+00', 'x'),
             (4, 'todo', '2029-12-31 00:00:00+00', 'x');
         UPDATE slo_items SET deadline = '2029-01-01' WHERE id = 1;
         UPDATE slo_items SET note = 'unrelated' WHERE id = 2;",
    )
    .await
    .expect("attach with order_by");
    let order: String = scalar(
        &pg,
        "SELECT string_agg(key, ',') FROM (
             SELECT (lease.claim_pending(1, '1 minute', 'w', 'slo_items')).key
               FROM generate_series(1, 4)) AS c",
    )
    .await;
    assert_eq!(
        order, "1,4,2,3",
        "earliest deadline first, microseconds apart"
    );
    for (sql, code) in [
        (
            "SELECT lease.attach('slo_items2', 'true', order_by => 'nope')",
            "42703",
        ),
        (
            "SELECT lease.attach('slo_items2', 'true', order_by => 'note')",
            "0A000",
        ),
    ] {
        pg.batch_execute("CREATE TABLE IF NOT EXISTS slo_items2 (id int PRIMARY KEY, note text)")
            .await
            .expect("table");
        let err = pg.batch_execute(sql).await.expect_err(sql);
        assert_eq!(sqlstate(&err).as_deref(), Some(code), "{sql}");
    }
    // detach takes the reorder trigger along (it was left behind, and every
    // later change of the deadline failed on the queue it no longer had).
    pg.batch_execute(
        "SELECT lease.detach('slo_items');
         UPDATE slo_items SET deadline = '2031-01-01';
         SELECT lease.attach('slo_items', $$status = 'todo'$$, order_by => 'deadline');",
    )
    .await
    .expect("detach and attach again");
}
