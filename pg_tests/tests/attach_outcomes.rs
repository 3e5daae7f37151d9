//! An attached row's outcome written back to its table row: `attach(...,
//! on_dead => ..., on_cancel => ...)`. The transaction that ends a row only
//! records the write-back; these clusters run no background worker, so the
//! tests apply write-backs as the table's owner (`lease.apply_write_backs`),
//! as the worker or the owner's scheduler would. Where write-backs run, and
//! as whom, is tested in `security_write_backs.rs`.
//!
//! Before this, dead letters and cancels of attached rows were never
//! reflected in the domain (the application polled admin views to move
//! SCHEDULED to FAILED); each test failed before, when attach had neither
//! option. The deliberate break each was checked against is in
//! its doc comment ("Broken on purpose").

use std::time::Duration;

use pg_tests::{scalar, sqlstate, test_user, Cluster, SUPERUSER, TEST_DB};
use tokio_postgres::Client;

/// `items` attached with its failures and cancels written back to `status`.
async fn items(pg: &Client, max_attempts: i32) {
    // The extension's owner locks the rows (the grant is moot where it is
    // the superuser).
    let owner = test_user();
    pg.batch_execute(&format!(
        "CREATE TABLE items (id text PRIMARY KEY, status text NOT NULL, progress int DEFAULT 0,
                             why text);
         GRANT SELECT, UPDATE ON items TO {owner};
         SELECT lease.attach('items', $$status IN ('validating', 'in_progress')$$,
                             max_attempts => {max_attempts}, backoff_base => '10 milliseconds',
                             on_dead => $$status = 'failed', why = 'dead'$$,
                             on_cancel => $$status = 'cancelled'$$);"
    ))
    .await
    .expect("items");
}

/// Claims `key` of `items` for owner `a`: (id, epoch). The other rows the
/// claim took are abandoned (their attempt given back).
async fn claim(pg: &Client, key: &str, ttl: &str) -> (i64, i64) {
    let rows = pg
        .query(
            "SELECT id, epoch, key FROM lease.claim_pending(100, $1::text::interval, 'a', 'items')",
            &[&ttl],
        )
        .await
        .expect("claim");
    let (mine, others): (Vec<_>, Vec<_>) = rows
        .iter()
        .partition(|r| r.get::<_, Option<String>>(2).as_deref() == Some(key));
    let (ids, epochs): (Vec<i64>, Vec<i64>) = others
        .iter()
        .map(|r| (r.get::<_, i64>(0), r.get::<_, i64>(1)))
        .unzip();
    pg.execute(
        "SELECT * FROM lease.release_batch($1, 'a', $2, 'abandon')",
        &[&ids, &epochs],
    )
    .await
    .expect("abandon the others");
    let row = mine
        .first()
        .unwrap_or_else(|| panic!("{key} was not claimed"));
    (row.get(0), row.get(1))
}

/// How many rows a claim of up to 10 for owner `b` got (leaving them held).
async fn claim_any(pg: &Client) -> usize {
    pg.query(
        "SELECT 1 FROM lease.claim_pending(10, '1 minute', 'b', 'items')",
        &[],
    )
    .await
    .expect("claim")
    .len()
}

/// The status of `key` once the due write-backs are applied; `pg` must be
/// connected as the table's owner.
async fn status(pg: &Client, key: &str) -> String {
    pg.batch_execute("SELECT lease.apply_write_backs()")
        .await
        .expect("apply write-backs");
    scalar(pg, &format!("SELECT status FROM items WHERE id = '{key}'")).await
}

async fn lease_rows(pg: &Client) -> i64 {
    scalar(pg, "SELECT count(*) FROM lease.job WHERE queue = 'items'").await
}

/// Every way an attached row becomes a dead letter or cancelled shows in
/// its table row once the write-back is applied, and the lease row goes
/// with it (the table row left the predicate): `fail`, a retry past
/// max_attempts, `done` while the row still matched, a cancel of a pending
/// row by key, a cancel of a leased row ended by the holder's retry, and a
/// last expiry, which a sweep recovers like any other.
///
/// Broken on purpose: with the `pg_lease_outcome` trigger on lease.job
/// dropped, the rows stayed `validating` and the first assertion failed.
#[tokio::test]
async fn dead_letters_and_cancels_are_written_back_to_the_table() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    items(&pg, 2).await;
    pg.batch_execute(
        "INSERT INTO items (id, status) VALUES
             ('fail', 'validating'), ('retry', 'validating'), ('done', 'validating'),
             ('pending', 'validating'), ('leased', 'validating'), ('expired', 'validating'),
             ('other', 'new')",
    )
    .await
    .expect("insert");

    let (id, epoch) = claim(&pg, "fail", "1 minute").await;
    pg.execute("SELECT lease.release($1, 'a', $2, 'fail')", &[&id, &epoch])
        .await
        .expect("fail");
    assert_eq!(status(&pg, "fail").await, "failed");

    let (id, epoch) = claim(&pg, "done", "1 minute").await;
    pg.execute(
        "SELECT * FROM lease.release_batch(ARRAY[$1::bigint], 'a', ARRAY[$2::bigint], 'done')",
        &[&id, &epoch],
    )
    .await
    .expect("done");
    assert_eq!(
        status(&pg, "done").await,
        "failed",
        "a stranded done is dead"
    );

    // Two attempts: the second retry is a dead letter.
    for _ in 0..2 {
        let (id, epoch) = claim(&pg, "retry", "1 minute").await;
        pg.execute(
            "SELECT lease.release($1, 'a', $2, 'retry', clock_timestamp())",
            &[&id, &epoch],
        )
        .await
        .expect("retry");
    }
    assert_eq!(status(&pg, "retry").await, "failed");

    let cancelled: String = scalar(&pg, "SELECT lease.cancel_key('items', 'pending')").await;
    assert_eq!(cancelled, "cancelled");
    assert_eq!(status(&pg, "pending").await, "cancelled");

    let (id, epoch) = claim(&pg, "leased", "1 minute").await;
    let requested: String = scalar(&pg, "SELECT lease.cancel_key('items', 'leased')").await;
    assert_eq!(requested, "cancel_requested");
    assert_eq!(status(&pg, "leased").await, "validating", "still held");
    pg.execute("SELECT lease.release($1, 'a', $2, 'retry')", &[&id, &epoch])
        .await
        .expect("retry after cancel");
    assert_eq!(status(&pg, "leased").await, "cancelled");

    // Both attempts expire; the sweep (what the reaper runs) recovers each,
    // the second as a dead letter.
    for attempt in 0..2 {
        if attempt > 0 {
            // Past the 10 ms backoff of the first expiry.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        claim(&pg, "expired", "100 milliseconds").await;
        tokio::time::sleep(Duration::from_millis(150)).await;
        pg.batch_execute("SELECT lease.sweep()")
            .await
            .expect("sweep");
        let leased: i64 = scalar(
            &pg,
            "SELECT count(*) FROM lease.job WHERE queue = 'items' AND state = 'leased'",
        )
        .await;
        assert_eq!(leased, 0, "the sweep recovers it");
    }
    assert_eq!(claim_any(&pg).await, 0);
    assert_eq!(status(&pg, "expired").await, "failed");
    let why: String = scalar(&pg, "SELECT why FROM items WHERE id = 'expired'").await;
    assert_eq!(why, "dead");

    assert_eq!(status(&pg, "other").await, "new", "other rows untouched");
    assert_eq!(
        lease_rows(&pg).await,
        0,
        "every lease row left with its row"
    );
}

/// Claims and renewals never reach the outcome trigger, so PostgreSQL skips
/// it without preparing its WHEN (which it does once per statement that may
/// fire the trigger: ~32,000 instructions on every claim, docs/archive/
/// performance-history.md, batch 1). The trigger is limited to `UPDATE OF finished_at`, which none
/// of them sets; the test above walks every path that does.
///
/// Failed before this change: the trigger was `UPDATE OF state`, which
/// every claim sets.
#[tokio::test]
async fn claims_and_renewals_do_not_reach_the_outcome_trigger() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    let columns: Vec<String> = scalar(
        &pg,
        "SELECT array_agg(a.attname::text ORDER BY a.attnum)
           FROM pg_trigger t
           JOIN pg_attribute a ON a.attrelid = t.tgrelid AND a.attnum = ANY (t.tgattr)
          WHERE t.tgrelid = 'lease.job'::regclass AND t.tgname = 'pg_lease_outcome'",
    )
    .await;
    assert_eq!(columns, ["finished_at"], "the trigger's UPDATE OF list");
    let setting_it: Vec<String> = scalar(
        &pg,
        "SELECT coalesce(array_agg(p.proname::text ORDER BY p.proname), '{}')
           FROM pg_proc p
          WHERE p.pronamespace = 'lease'::regnamespace
            AND p.proname IN ('claim_pending', 'reclaim_own', 'renew', 'renew_batch')
            AND p.prosrc LIKE '%finished_at%'",
    )
    .await;
    assert!(
        setting_it.is_empty(),
        "claim or renewal functions that set finished_at: {setting_it:?}"
    );
}

/// The holder dead-letters a row while an acknowledgement consumer, which
/// already holds the table row, moves it on: the release touches only the
/// lease row, so it neither waits nor deadlocks, and the write-back it
/// recorded finds the row out of the predicate and leaves the consumer's
/// status. 10 rounds, no 40P01.
///
/// Broken on purpose (when the write-back ran inside the release): with
/// `release` not locking the table row first, every round died with 40P01.
#[tokio::test]
async fn a_failing_release_and_a_consumer_never_deadlock() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    items(&pg, 5).await;
    let consumer = cluster.connect().await;
    for round in 0..10 {
        let key = format!("r{round}");
        pg.execute(
            "INSERT INTO items (id, status) VALUES ($1, 'validating')",
            &[&key],
        )
        .await
        .expect("insert");
        let (id, epoch) = claim(&pg, &key, "1 minute").await;
        consumer
            .batch_execute(&format!(
                "BEGIN; UPDATE items SET progress = 1 WHERE id = '{key}'"
            ))
            .await
            .expect("consumer holds the row");
        let holder = cluster.connect().await;
        let release = tokio::spawn(async move {
            holder
                .query_one("SELECT lease.release($1, 'a', $2, 'fail')", &[&id, &epoch])
                .await
                .map(|row| row.get::<_, bool>(0))
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let moved = consumer
            .batch_execute(&format!(
                "UPDATE items SET status = 'deleted' WHERE id = '{key}'; COMMIT"
            ))
            .await;
        if let Err(err) = &moved {
            consumer.batch_execute("ROLLBACK").await.ok();
            panic!("round {round}: consumer failed: {:?}", sqlstate(err));
        }
        let released = release.await.expect("join");
        if let Err(err) = released {
            panic!("round {round}: release failed: {:?}", sqlstate(&err));
        }
        assert_eq!(status(&pg, &key).await, "deleted");
    }
}

/// A tenant who owns an attached table cannot turn its outcome function
/// into code that runs with the extension owner's rights: made SECURITY
/// INVOKER (so that it would run as whoever calls it), it is refused with
/// 55000 where the write-back is applied, and runs nowhere; the worker's
/// release only recorded the write-back.
///
/// Broken on purpose: with `lease._outcome_function` not checking
/// `prosecdef`, the worker's release made the tenant superuser (when the
/// write-back ran inside the release).
#[tokio::test]
async fn a_tenant_cannot_make_its_outcome_function_run_as_the_extension() {
    let cluster = Cluster::start();
    // The operator creates the roles (in SQL mode the test role may not).
    let su = cluster.connect_to(TEST_DB, SUPERUSER).await;
    su.batch_execute(
        "CREATE ROLE tenant LOGIN IN ROLE lease_admin;
         CREATE ROLE worker LOGIN IN ROLE lease_worker;
         GRANT CREATE ON SCHEMA public TO tenant;",
    )
    .await
    .expect("roles");
    let tenant = cluster.connect_to(TEST_DB, "tenant").await;
    items(&tenant, 5).await;
    tenant
        .batch_execute(
            "INSERT INTO items (id, status) VALUES ('x', 'validating');
             CREATE OR REPLACE FUNCTION public.items_pg_lease_outcome(key text, outcome text)
             RETURNS void LANGUAGE sql SECURITY INVOKER AS 'ALTER ROLE tenant SUPERUSER';",
        )
        .await
        .expect("tenant's own function");
    let worker = cluster.connect_to(TEST_DB, "worker").await;
    let (id, epoch) = claim(&worker, "x", "1 minute").await;
    worker
        .execute("SELECT lease.release($1, 'a', $2, 'fail')", &[&id, &epoch])
        .await
        .expect("the release only records the write-back");
    tenant
        .batch_execute("SELECT lease.apply_write_backs()")
        .await
        .expect("apply");
    let error: String = scalar(&su, "SELECT last_error FROM lease.write_backs").await;
    assert!(error.starts_with("55000"), "{error}");
    let superuser: bool = scalar(
        &su,
        "SELECT rolsuper FROM pg_roles WHERE rolname = 'tenant'",
    )
    .await;
    assert!(!superuser);
    let status: String = scalar(&su, "SELECT status FROM items WHERE id = 'x'").await;
    assert_eq!(status, "validating", "nothing changed");
    // Detach takes the function along.
    tenant
        .batch_execute("SELECT lease.detach('items')")
        .await
        .expect("detach");
    let left: i64 = scalar(
        &su,
        "SELECT count(*) FROM pg_proc WHERE proname IN ('items_pg_lease_outcome', 'items_pg_lease_match')",
    )
    .await;
    assert_eq!(left, 0);
}

/// Without the library the extension's owner is the installing role, no
/// superuser: attach refuses (42501, with the GRANT to run as its hint) a
/// table that role may not read and lock, and creates nothing.
///
/// Failed before the check in `lease._attach_register`: attach succeeded,
/// and the worker's release of a claimed row failed later with 42501
/// "permission denied for table items", stranding the lease. (With the
/// library the owner is a superuser; there is nothing to refuse.)
#[tokio::test]
async fn without_the_library_attach_refuses_a_table_the_install_cannot_lock() {
    if !pg_tests::sql_install_mode() {
        eprintln!("skipped: only the install without the library has an owner who is no superuser");
        return;
    }
    let cluster = Cluster::start();
    let su = cluster.connect_to(TEST_DB, SUPERUSER).await;
    su.batch_execute(
        "CREATE ROLE tenant LOGIN IN ROLE lease_admin;
         GRANT CREATE ON SCHEMA public TO tenant;",
    )
    .await
    .expect("roles");
    let tenant = cluster.connect_to(TEST_DB, "tenant").await;
    tenant
        .batch_execute("CREATE TABLE items (id text PRIMARY KEY, status text NOT NULL)")
        .await
        .expect("table");
    let err = tenant
        .batch_execute("SELECT lease.attach('items', $$status = 'new'$$)")
        .await
        .expect_err("refused");
    assert_eq!(sqlstate(&err).as_deref(), Some("42501"), "{err:?}");
    let made: i64 = scalar(
        &su,
        "SELECT (SELECT count(*) FROM lease.queue WHERE name = 'items')
              + (SELECT count(*) FROM pg_trigger WHERE tgrelid = 'items'::regclass)
              + (SELECT count(*) FROM pg_proc WHERE proname = 'items_pg_lease_match')",
    )
    .await;
    assert_eq!(made, 0, "nothing of the attachment is left");
    tenant
        .batch_execute(&format!(
            "GRANT SELECT, UPDATE ON items TO {}; SELECT lease.attach('items', $$status = 'new'$$)",
            test_user()
        ))
        .await
        .expect("attached once granted");
}

/// The client's `apply_write_backs` (what the `Sweeper` calls after each
/// sweep) applies the write-backs of the tables its role owns.
///
/// Failed before its statement got a slot: every call was refused with
/// "no statement slot for ApplyWriteBacks", so a Sweeper applied nothing.
#[tokio::test]
async fn the_client_applies_the_write_backs_of_its_role() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    items(&pg, 5).await;
    pg.batch_execute(
        "INSERT INTO items (id, status) VALUES ('x', 'validating');
         SELECT lease.cancel_key('items', 'x');",
    )
    .await
    .expect("a cancel");
    let client = pg_tests::jobs::client(&cluster).await;
    let handled = client.apply_write_backs(10).await.expect("apply");
    assert_eq!(handled, 1);
    let status: String = scalar(&pg, "SELECT status FROM items WHERE id = 'x'").await;
    assert_eq!(status, "cancelled");
}

/// `lease.fence` reads an attached table only as its owner, or not at all.
/// The tenant's index predicate is an immutable function of no column, which
/// PostgreSQL's planner runs when it plans a read of the table. With the
/// library the fence's read runs as the tenant (security_table_owner.rs
/// attacks it); without it the read would run as the installing role, so
/// the fence refuses such a table (0A000) before planning anything.
///
/// Failed before in both modes: the function ran as the extension owner
/// (the superuser, or the installing role without the library).
#[tokio::test]
async fn fence_reads_an_attached_table_only_as_its_owner() {
    let cluster = Cluster::start();
    let su = cluster.connect_to(TEST_DB, SUPERUSER).await;
    su.batch_execute(
        "CREATE ROLE tenant LOGIN IN ROLE lease_admin;
         CREATE SCHEMA t AUTHORIZATION tenant;
         GRANT USAGE ON SCHEMA t TO PUBLIC;",
    )
    .await
    .expect("roles");
    let tenant = cluster.connect_to(TEST_DB, "tenant").await;
    tenant
        .batch_execute(&format!(
            "CREATE TABLE t.ran (who text);
             GRANT INSERT ON t.ran TO PUBLIC;
             CREATE FUNCTION t.record() RETURNS boolean LANGUAGE plpgsql AS $f$
             BEGIN
                 INSERT INTO t.ran VALUES (current_user);
                 RETURN true;
             END $f$;
             CREATE FUNCTION t.folded() RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $f$
             BEGIN
                 RETURN t.record();
             END $f$;
             CREATE TABLE t.items (id text PRIMARY KEY, status text NOT NULL);
             GRANT SELECT, UPDATE ON t.items TO {};
             SELECT lease.attach('t.items', $$status = 'new'$$);
             INSERT INTO t.items VALUES ('a', 'new');
             CREATE INDEX items_folded ON t.items (status) WHERE t.folded();
             TRUNCATE t.ran;",
            test_user()
        ))
        .await
        .expect("the tenant's table");
    let row = tenant
        .query_one(
            "SELECT id, epoch FROM lease.claim_pending(1, '1 hour', 'w', 'items')",
            &[],
        )
        .await
        .expect("a lease on row 'a'");
    let (id, epoch): (i64, i64) = (row.get(0), row.get(1));
    let fenced = su
        .batch_execute(&format!("BEGIN; SELECT lease.fence({id}, {epoch}); COMMIT"))
        .await;
    // Ends the transaction the refusal left open (a warning otherwise).
    su.batch_execute("ROLLBACK").await.expect("rollback");
    let ran: Vec<String> = su
        .query("SELECT who FROM t.ran", &[])
        .await
        .expect("t.ran")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(ran.iter().all(|who| who == "tenant"), "{ran:?}");
    if pg_tests::sql_install_mode() {
        let err = fenced.expect_err("refused without the library");
        assert_eq!(sqlstate(&err).as_deref(), Some("0A000"), "{err:?}");
    } else {
        fenced.expect("fenced as the tenant");
        assert_eq!(ran, ["tenant"], "the planner ran it once, as the tenant");
    }
}
