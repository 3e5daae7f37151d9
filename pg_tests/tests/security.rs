// pg_tests: library only: it attacks the library install and its reaper as other roles.
//! pg_lease attacked the way its users could attack it: each test acts as
//! the role that would attack (a role with only CREATEDB, a lease_worker of
//! another queue, a lease_admin that does not own a table), never as the
//! superuser, and checks both the refusal and that nothing changed.
//!
//! Every test here failed before the security pass; its doc comment says
//! which weakness of the review it reproduces.

use std::time::Duration;

use pg_tests::{eventually, reaper_conf, scalar, sqlstate, Cluster, ClusterConfig, TEST_DB};
use tokio_postgres::Client;

/// A cluster whose reaper sweeps every 100 ms, logging worker starts.
fn preloaded(extra: &[&str]) -> Cluster {
    let mut extra_conf = reaper_conf(Duration::from_millis(100));
    extra_conf.extend(extra.iter().map(|s| (*s).to_owned()));
    Cluster::start_with(ClusterConfig {
        extra_conf,
        ..Default::default()
    })
}

/// Login roles for the attacks: `mallory` (CREATEDB only), `alice` and `bob`
/// (lease_worker, each the tenant of one queue), `ops` (lease_admin).
async fn roles(su: &Client) {
    su.batch_execute(
        "CREATE ROLE mallory LOGIN CREATEDB;
         CREATE ROLE alice LOGIN IN ROLE lease_worker;
         CREATE ROLE bob LOGIN IN ROLE lease_worker;
         CREATE ROLE ops LOGIN IN ROLE lease_admin;
         GRANT CREATE ON SCHEMA public TO alice, bob, ops;",
    )
    .await
    .expect("roles");
}

/// The SQLSTATE `sql` fails with; panics if it succeeds.
async fn fails(client: &Client, sql: &str) -> String {
    match client.batch_execute(sql).await {
        Ok(()) => panic!("expected an error from: {sql}"),
        Err(err) => sqlstate(&err).unwrap_or_else(|| panic!("{sql}: {err}")),
    }
}

/// Critical: a database owner's operator ran as the superuser
/// inside the reaper. Mallory, with nothing but CREATEDB, creates a database
/// whose search_path puts her own `=` before pg_catalog's; on main the
/// sweeper's first query resolved it and made her superuser within a second.
#[tokio::test]
async fn a_database_owner_cannot_run_code_in_the_reaper() {
    let cluster = preloaded(&[]);
    let su = cluster.connect().await;
    roles(&su).await;
    let mallory = cluster.connect_to(TEST_DB, "mallory").await;
    mallory
        .batch_execute("CREATE DATABASE t")
        .await
        .expect("createdb");
    // The same trap once in a database without pg_lease and once in one
    // where the superuser installed it for her.
    su.batch_execute("CREATE DATABASE t2 OWNER mallory")
        .await
        .expect("t2");
    cluster.psql("t2", "CREATE EXTENSION pg_lease");
    for db in ["t", "t2"] {
        let m = cluster.connect_to(db, "mallory").await;
        m.batch_execute(&format!(
            "CREATE SCHEMA evil;
             CREATE TABLE evil.ran (who text, db text);
             CREATE FUNCTION evil.eq(name, name) RETURNS boolean LANGUAGE plpgsql AS $f$
             BEGIN
                 INSERT INTO evil.ran VALUES (current_user, current_database());
                 IF current_user <> 'mallory' THEN
                     EXECUTE 'ALTER ROLE mallory SUPERUSER';
                 END IF;
                 RETURN $1::text OPERATOR(pg_catalog.=) $2::text;
             END $f$;
             CREATE OPERATOR evil.= (LEFTARG = name, RIGHTARG = name, FUNCTION = evil.eq);
             CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = pg_catalog.texteq);
             GRANT USAGE ON SCHEMA evil TO PUBLIC;
             GRANT INSERT ON evil.ran TO PUBLIC;
             ALTER DATABASE {db} SET search_path = evil, pg_catalog;"
        ))
        .await
        .expect("trap");
    }
    // Ten sweep intervals, twice the time it took on main.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !scalar::<bool>(
            &su,
            "SELECT rolsuper FROM pg_roles WHERE rolname = 'mallory'"
        )
        .await,
        "the reaper made mallory superuser"
    );
    for db in ["t", "t2"] {
        let m = cluster.connect_to(db, "mallory").await;
        let ran: i64 = scalar(&m, "SELECT count(*) FROM evil.ran WHERE who <> 'mallory'").await;
        assert_eq!(ran, 0, "someone else ran mallory's operator in {db}");
    }
}

/// The same weakness and the reaper's cost: before, the launcher forked a sweeper
/// into every database every interval, extension or not, idle or not. Here,
/// over two seconds (twenty intervals), a database without pg_lease and an
/// idle one with it are each visited at most twice (discovery, and the
/// first sweep); a lease claimed in the idle one is still recovered within
/// ttl + interval.
#[tokio::test]
async fn idle_databases_are_not_visited_every_pass() {
    let cluster = preloaded(&["log_min_messages = debug1"]);
    let su = cluster.connect().await;
    su.batch_execute("CREATE DATABASE plain").await.expect("db");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = cluster.server_log();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let log = cluster.server_log();
    let new = &log[before.len()..];
    let visits = |db: &str| {
        new.lines()
            .filter(|l| l.contains("starting background worker process") && l.contains(db))
            .count()
    };
    assert!(
        visits("plain") <= 1,
        "plain visited {} times",
        visits("plain")
    );
    assert!(
        visits(TEST_DB) <= 2,
        "idle {TEST_DB} swept {} times",
        visits(TEST_DB)
    );

    su.batch_execute(
        "SELECT lease.enqueue('default', '{}'); SELECT lease.claim_pending(1, '300 ms', 'crashed')",
    )
    .await
    .expect("a lease that will expire");
    let took = eventually(
        &su,
        "SELECT state = 'pending' FROM lease.job",
        Duration::from_secs(5),
    )
    .await;
    assert!(
        took < Duration::from_millis(300 + 100 + 1000),
        "recovered after {took:?}"
    );
}

/// An attached table owned by ops with one row leased by its worker.
async fn billing(cluster: &Cluster, su: &Client) -> (i64, i64) {
    let ops = cluster.connect_to(TEST_DB, "ops").await;
    ops.batch_execute(
        "CREATE TABLE invoices (id text PRIMARY KEY, status text NOT NULL);
         GRANT SELECT, INSERT, UPDATE, DELETE ON invoices TO alice;
         INSERT INTO invoices VALUES ('inv-1', 'open'), ('inv-3', 'cancelled'), ('inv-9', 'open');",
    )
    .await
    .expect("table");
    let attached = ops
        .query_one(
            "SELECT lease.attach('invoices', $$status = 'open'$$, queue => 'billing')",
            &[],
        )
        .await;
    if let Err(err) = attached {
        // A lease_admin could not attach before the fix; attach as su instead.
        eprintln!("attach as ops: {err}");
        su.batch_execute(
            "SELECT lease.attach('invoices', $$status = 'open'$$, queue => 'billing')",
        )
        .await
        .expect("attach as superuser");
    }
    let row = su
        .query_one(
            "SELECT id, epoch FROM lease.claim_pending(1, '1 minute', 'alice-1', 'billing') WHERE key = 'inv-1'",
            &[],
        )
        .await
        .expect("claim inv-1");
    (row.get(0), row.get(1))
}

/// `sync_attached` was granted to every lease_worker and ended or
/// resurrected rows of any queue by key, and a worker could aim the
/// attached-table trigger function at another tenant's queue from a table
/// of its own. Bob (a lease_worker with no business in billing) tries all
/// three; the held lease and the cancelled row must stay as they are.
#[tokio::test]
async fn a_worker_cannot_reach_another_queue_through_attached_table_internals() {
    let cluster = preloaded(&[]);
    let su = cluster.connect().await;
    roles(&su).await;
    let (id, epoch) = billing(&cluster, &su).await;
    let bob = cluster.connect_to(TEST_DB, "bob").await;
    for sql in [
        "SELECT lease.sync_attached('billing', '{}', ARRAY['inv-1'])",
        "SELECT lease.sync_attached('billing', ARRAY['inv-3'], ARRAY['inv-3'])",
    ] {
        let code = fails(&bob, sql).await;
        assert!(["42501", "42883"].contains(&code.as_str()), "{sql}: {code}");
    }
    // A trigger on bob's own table, pointed at billing.
    bob.batch_execute("CREATE TABLE mine (id text PRIMARY KEY)")
        .await
        .expect("own table");
    let trigger = bob
        .batch_execute(
            "CREATE TRIGGER t AFTER INSERT ON mine FOR EACH ROW
             EXECUTE FUNCTION lease.attached_row_changed('billing', 'id', 'stop')",
        )
        .await;
    if trigger.is_ok() {
        let _ = bob
            .batch_execute("INSERT INTO mine VALUES ('inv-1'), ('inv-9')")
            .await;
    }
    let state: String = scalar(
        &su,
        &format!("SELECT state::text FROM lease.job WHERE id = {id} AND epoch = {epoch}"),
    )
    .await;
    assert_eq!(state, "leased", "alice's lease survives");
    let others: i64 = scalar(
        &su,
        "SELECT count(*) FROM lease.job WHERE queue = 'billing' AND key IN ('inv-3', 'inv-9')",
    )
    .await;
    assert_eq!(others, 1, "inv-9 still pending, inv-3 not resurrected");
}

/// The admin half of the same: `register_attachment` and
/// `unregister_attachment` were callable directly by any lease_admin, so ops
/// could squat a table it does not own or drop another owner's attachment.
#[tokio::test]
async fn an_admin_cannot_attach_or_detach_a_table_it_does_not_own() {
    let cluster = preloaded(&[]);
    let su = cluster.connect().await;
    roles(&su).await;
    su.batch_execute(
        "CREATE ROLE ops2 LOGIN IN ROLE lease_admin;
         CREATE TABLE theirs (id bigint PRIMARY KEY, s text);
         ALTER TABLE theirs OWNER TO alice;",
    )
    .await
    .expect("setup");
    billing(&cluster, &su).await;
    let ops2 = cluster.connect_to(TEST_DB, "ops2").await;
    for sql in [
        "SELECT lease.attach('theirs', 's = ''x''')",
        "SELECT lease.detach('invoices')",
        "SELECT lease.register_attachment('theirs', 'q', 'id', 'true', 25, '1s', '1h', '7d')",
        "SELECT lease.unregister_attachment('billing')",
    ] {
        let code = fails(&ops2, sql).await;
        assert!(["42501", "42883"].contains(&code.as_str()), "{sql}: {code}");
    }
    let attached: i64 = scalar(&su, "SELECT count(*) FROM lease.attachment").await;
    assert_eq!(attached, 1, "only billing is attached");
}

/// Enqueue into an attached table's queue handed out a row that
/// did not match the predicate. It is refused with 42809 now.
#[tokio::test]
async fn enqueue_into_an_attached_queue_is_refused() {
    let cluster = preloaded(&[]);
    let su = cluster.connect().await;
    roles(&su).await;
    billing(&cluster, &su).await;
    let alice = cluster.connect_to(TEST_DB, "alice").await;
    for sql in [
        "SELECT lease.enqueue('billing', '{}', key => 'inv-3')",
        "SELECT lease.enqueue_batch('billing', ARRAY['{}'::jsonb], ARRAY['inv-3'])",
    ] {
        assert_eq!(fails(&alice, sql).await, "42809", "{sql}");
    }
    let n: i64 = scalar(&su, "SELECT count(*) FROM lease.job WHERE key = 'inv-3'").await;
    assert_eq!(n, 0);
}

/// `backoff` multiplied before capping, so one row with a high
/// attempt count made every sweep of the database fail with 22008 and no
/// other queue's expired lease was recovered. Alice drives the attempt up
/// with `reclaim_own` (which on main also passed max_attempts).
#[tokio::test]
async fn one_row_cannot_stop_the_reaper() {
    let cluster = preloaded(&[]);
    let su = cluster.connect().await;
    roles(&su).await;
    su.batch_execute(
        "SELECT lease.create_queue('slow', max_attempts => 1000, backoff_base => '30 seconds', backoff_max => '1 hour');
         SELECT lease.create_queue('other');
         SELECT lease.enqueue('slow', '{}'); SELECT lease.enqueue('other', '{}');",
    )
    .await
    .expect("setup");
    let alice = cluster.connect_to(TEST_DB, "alice").await;
    alice
        .batch_execute("SELECT lease.claim_pending(1, '200 ms', 'a', 'slow')")
        .await
        .expect("claim");
    for _ in 0..45 {
        alice
            .batch_execute("SELECT lease.reclaim_own(1, '200 ms', 'a', 'slow')")
            .await
            .expect("reclaim");
    }
    alice
        .batch_execute("SELECT lease.claim_pending(1, '200 ms', 'a', 'other')")
        .await
        .expect("claim other");
    eventually(
        &su,
        "SELECT state = 'pending' FROM lease.job WHERE queue = 'other'",
        Duration::from_secs(5),
    )
    .await;
    let last_error: Option<String> = scalar(&su, "SELECT last_error FROM lease.reaper_stats").await;
    assert_eq!(last_error, None, "no sweep failed");
    let attempt: i32 = scalar(&su, "SELECT attempt FROM lease.job WHERE queue = 'slow'").await;
    assert!(
        attempt <= 1000,
        "attempts stay bounded by max_attempts: {attempt}"
    );
}

/// Queue options were compared as intervals only, so absurd
/// values ('300000 years') were accepted and later overflowed.
#[tokio::test]
async fn queue_options_are_validated_by_value() {
    let cluster = preloaded(&[]);
    let su = cluster.connect().await;
    roles(&su).await;
    let ops = cluster.connect_to(TEST_DB, "ops").await;
    for opts in [
        "backoff_base => '300000 years', backoff_max => '300000 years'",
        "retention => '300000 years'",
        "dead_retention => 'infinity'",
        "backoff_max => '1 month -29 days 23 hours'",
    ] {
        let sql = format!("SELECT lease.create_queue('q', {opts})");
        // PostgreSQL 15 and 16 cannot even spell an infinite interval (22007).
        let code = fails(&ops, &sql).await;
        assert!(["22023", "22007"].contains(&code.as_str()), "{sql}: {code}");
    }
    assert!(
        !scalar::<bool>(
            &su,
            "SELECT EXISTS (SELECT FROM lease.queue WHERE name = 'q')"
        )
        .await
    );
}

/// The one-day cap on ttl was checked by interval comparison,
/// which mixed units pass: '1000 years -359999 days' compares as one day
/// but leases for 5,242 days.
#[tokio::test]
async fn a_lease_cannot_outlive_the_ttl_cap() {
    let cluster = preloaded(&[]);
    let su = cluster.connect().await;
    roles(&su).await;
    su.batch_execute("SELECT lease.enqueue('default', '{}')")
        .await
        .expect("enqueue");
    let alice = cluster.connect_to(TEST_DB, "alice").await;
    for sql in [
        "SELECT lease.claim_pending(1, '1000 years -359999 days', 'a')",
        "SELECT lease.try_acquire('n', 'a', '1000 years -359999 days')",
        "SELECT lease.claim_pending(1, '1 month -29 days 1 hour', 'a')",
    ] {
        assert_eq!(fails(&alice, sql).await, "22023", "{sql}");
    }
    let held: i64 = scalar(&su, "SELECT count(*) FROM lease.job WHERE state = 'leased'").await;
    assert_eq!(held, 0);
}

/// Infinite times were accepted: '-infinity' jumped every queue
/// and made `queue_stats` fail with 22008, 'infinity' parked a row forever.
#[tokio::test]
async fn infinite_times_are_refused() {
    let cluster = preloaded(&[]);
    let su = cluster.connect().await;
    roles(&su).await;
    let alice = cluster.connect_to(TEST_DB, "alice").await;
    for sql in [
        "SELECT lease.enqueue('default', '{}', run_at => '-infinity')",
        "SELECT lease.enqueue('default', '{}', run_at => 'infinity')",
        "SELECT lease.enqueue_batch('default', ARRAY['{}'::jsonb], run_at => '-infinity')",
    ] {
        assert_eq!(fails(&alice, sql).await, "22023", "{sql}");
    }
    alice
        .batch_execute("SELECT lease.enqueue('default', '{}')")
        .await
        .expect("enqueue");
    let row = alice
        .query_one(
            "SELECT id, epoch FROM lease.claim_pending(1, '1 minute', 'a')",
            &[],
        )
        .await
        .expect("claim");
    let (id, epoch): (i64, i64) = (row.get(0), row.get(1));
    let sql = format!("SELECT lease.release({id}, 'a', {epoch}, 'retry', retry_at => '-infinity')");
    assert_eq!(fails(&alice, &sql).await, "22023");
    let stats: i64 = scalar(&su, "SELECT count(*) FROM lease.queue_stats").await;
    assert!(stats >= 1);
}

/// Attach and detach failed with 42501 for a lease_admin that
/// owns the table (EXECUTE on an internal check function was missing).
#[tokio::test]
async fn an_admin_attaches_and_detaches_its_own_table() {
    let cluster = preloaded(&[]);
    let su = cluster.connect().await;
    roles(&su).await;
    let ops = cluster.connect_to(TEST_DB, "ops").await;
    ops.batch_execute(
        "CREATE TABLE tasks (id bigint PRIMARY KEY, status text);
         INSERT INTO tasks VALUES (1, 'todo'), (2, 'done');
         SELECT lease.attach('tasks', $$status = 'todo'$$);",
    )
    .await
    .expect("attach as the owner");
    let n: i64 = scalar(&su, "SELECT count(*) FROM lease.job WHERE queue = 'tasks'").await;
    assert_eq!(n, 1);
    let removed: i64 = scalar(&ops, "SELECT lease.detach('tasks')").await;
    assert_eq!(removed, 1);
}

/// There was no per-queue access control. With `lease.grant`,
/// bob (granted billing-free queue `beta` only) can do nothing to alice's
/// queue `alpha`, not even with her exact token, owner name and id.
#[tokio::test]
async fn a_worker_of_one_queue_cannot_touch_another() {
    let cluster = preloaded(&[]);
    let su = cluster.connect().await;
    roles(&su).await;
    su.batch_execute(
        "SELECT lease.create_queue('alpha'); SELECT lease.create_queue('beta');
         SELECT lease.grant('alpha', 'alice'); SELECT lease.grant('beta', 'bob');
         SELECT lease.enqueue('alpha', '{\"secret\": 1}'); SELECT lease.enqueue('alpha', '{}');",
    )
    .await
    .expect("setup");
    let alice = cluster.connect_to(TEST_DB, "alice").await;
    let row = alice
        .query_one(
            "SELECT id, epoch FROM lease.claim_pending(1, '1 minute', 'alice-1', 'alpha')",
            &[],
        )
        .await
        .expect("alice claims her own queue");
    let (id, epoch): (i64, i64) = (row.get(0), row.get(1));
    let pending: i64 = scalar(&su, "SELECT id FROM lease.job WHERE state = 'pending'").await;
    let bob = cluster.connect_to(TEST_DB, "bob").await;
    // Named, alpha is a queue bob cannot know of (42704, as if it did not
    // exist, queue_access.rs); its rows are refused (42501).
    for sql in [
        "SELECT * FROM lease.claim_pending(1, '1 minute', 'bob', 'alpha')",
        "SELECT * FROM lease.reclaim_own(1, '1 minute', 'alice-1', 'alpha')",
        "SELECT lease.bind_session('alpha', 'alice-1')",
        "SELECT lease.enqueue('alpha', '{}')",
    ] {
        assert_eq!(fails(&bob, sql).await, "42704", "{sql}");
    }
    for sql in [
        "DELETE FROM lease.session".to_owned(),
        format!("SELECT lease.fenced_update({id}, {epoch}, '{{\"secret\": 2}}')"),
        format!("SELECT lease.fence({id}, {epoch})"),
        format!("SELECT lease.renew({id}, 'alice-1', {epoch}, '1 hour')"),
        format!("SELECT lease.release({id}, 'alice-1', {epoch}, 'fail')"),
        format!("SELECT * FROM lease.release_batch(ARRAY[{id}], 'alice-1', ARRAY[{epoch}])"),
        format!(
            "SELECT * FROM lease.renew_batch(ARRAY[{id}], 'alice-1', ARRAY[{epoch}], '1 hour')"
        ),
        format!("SELECT lease.cancel({pending})"),
        format!("SELECT lease.cancel({id})"),
    ] {
        assert_eq!(fails(&bob, &sql).await, "42501", "{sql}");
    }
    let row = su
        .query_one(
            &format!("SELECT state::text, epoch, payload->>'secret', cancel_requested FROM lease.job WHERE id = {id}"),
            &[],
        )
        .await
        .expect("row");
    assert_eq!(row.get::<_, String>(0), "leased");
    assert_eq!(row.get::<_, i64>(1), epoch);
    assert_eq!(row.get::<_, Option<String>>(2).as_deref(), Some("1"));
    assert!(!row.get::<_, bool>(3));
    let pending_state: String = scalar(
        &su,
        &format!("SELECT state::text FROM lease.job WHERE id = {pending}"),
    )
    .await;
    assert_eq!(pending_state, "pending");
    // Alice's own work goes on; bob's queue is his.
    assert!(
        scalar::<bool>(
            &alice,
            &format!("SELECT lease.release({id}, 'alice-1', {epoch})")
        )
        .await
    );
    bob.batch_execute("SELECT lease.enqueue('beta', '{}')")
        .await
        .expect("bob's queue");
}

/// pg_dump/pg_restore lost every queue, job, named lease and
/// attachment while the attached table's triggers were restored, so inserts
/// into it failed with 23503. After a restore, held leases still renew under
/// their tokens, attached tables work, new ids continue past old ones, and
/// a rate limit still counts the claims made before the dump.
#[tokio::test]
async fn lease_state_survives_dump_and_restore() {
    let cluster = preloaded(&[]);
    let su = cluster.connect().await;
    su.batch_execute(
        "SELECT lease.create_queue('jobs', max_attempts => 7, rate_limit => 2, rate_period => '1 day');
         SELECT lease.enqueue('jobs', '{\"n\": 1}'); SELECT lease.enqueue('jobs', '{\"n\": 2}');
         CREATE TABLE items (id bigint PRIMARY KEY, status text);
         INSERT INTO items VALUES (1, 'todo');
         SELECT lease.attach('items', $$status = 'todo'$$);",
    )
    .await
    .expect("setup");
    let row = su
        .query_one(
            "SELECT id, epoch FROM lease.claim_pending(1, '10 minutes', 'w', 'jobs')",
            &[],
        )
        .await
        .expect("claim");
    let (id, epoch): (i64, i64) = (row.get(0), row.get(1));
    let named: i64 = scalar(&su, "SELECT lease.try_acquire('leader', 'w', '10 minutes')").await;
    let max_id: i64 = scalar(&su, "SELECT max(id) FROM lease.job").await;

    cluster.dump_and_restore(TEST_DB, "restored");
    let r = cluster.connect_to("restored", "postgres").await;
    let renewed: bool = scalar(
        &r,
        &format!("SELECT (lease.renew({id}, 'w', {epoch}, '10 minutes')).held"),
    )
    .await;
    assert!(renewed, "the held lease renews under its token");
    assert!(
        scalar::<Option<String>>(
            &r,
            &format!("SELECT lease.renew_named('leader', 'w', {named}, '1 minute')::text")
        )
        .await
        .is_some(),
        "the named lease renews under its epoch"
    );
    let max_attempts: i32 = scalar(
        &r,
        "SELECT max_attempts FROM lease.queue WHERE name = 'jobs'",
    )
    .await;
    assert_eq!(max_attempts, 7);
    r.batch_execute("INSERT INTO items VALUES (2, 'todo')")
        .await
        .expect("insert into the attached table");
    let attached: i64 = scalar(&r, "SELECT count(*) FROM lease.job WHERE queue = 'items'").await;
    assert_eq!(attached, 2, "old and new items are claimable");
    let new_id: i64 = scalar(&r, "SELECT lease.enqueue('jobs', '{}')").await;
    assert!(
        new_id > max_id,
        "ids continue past the old ones ({new_id} <= {max_id})"
    );
    let epoch_again: i64 = scalar(
        &r,
        &format!("SELECT epoch FROM lease.claim_pending(1, '1 minute', 'w2', 'jobs') WHERE id <> {id} LIMIT 1"),
    )
    .await;
    assert!(epoch_again > 0);
    // The rate limit's record came along: two claims in a day were its two.
    let over: i64 = scalar(
        &r,
        "SELECT count(*) FROM lease.claim_pending(5, '1 minute', 'w2', 'jobs')",
    )
    .await;
    assert_eq!(over, 0, "the rate limit's record survives");
}

/// The other half of that: DROP and CREATE EXTENSION restarted ids and
/// named-lease epochs, so the first claim (or acquisition) after it handed
/// out a token that a zombie of the old install still held.
#[tokio::test]
async fn a_reinstall_never_reissues_a_token() {
    let cluster = preloaded(&[]);
    let su = cluster.connect().await;
    su.batch_execute("SELECT lease.enqueue('default', '{}')")
        .await
        .expect("enqueue");
    let row = su
        .query_one(
            "SELECT id, epoch FROM lease.claim_pending(1, '1 minute', 'zombie')",
            &[],
        )
        .await
        .expect("claim");
    let (id, epoch): (i64, i64) = (row.get(0), row.get(1));
    let mut named = 0;
    for _ in 0..3 {
        named = scalar::<i64>(
            &su,
            "SELECT lease.try_acquire('leader', 'zombie', '1 minute')",
        )
        .await;
    }
    su.batch_execute(
        "DROP EXTENSION pg_lease; CREATE EXTENSION pg_lease; SELECT lease.enqueue('default', '{}')",
    )
    .await
    .expect("reinstall");
    let row = su
        .query_one(
            "SELECT id, epoch FROM lease.claim_pending(1, '1 minute', 'fresh')",
            &[],
        )
        .await
        .expect("claim after reinstall");
    assert_ne!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (id, epoch));
    assert!(
        !scalar::<bool>(
            &su,
            &format!("SELECT lease.fenced_update({id}, {epoch}, '{{\"z\": 1}}')")
        )
        .await,
        "the zombie's token is not valid in the new install"
    );
    let named_again: i64 = scalar(
        &su,
        "SELECT lease.try_acquire('leader', 'fresh', '1 minute')",
    )
    .await;
    assert!(
        named_again > named,
        "named epoch {named_again} reissued (had {named})"
    );
    let fenced = su
        .batch_execute(&format!("SELECT lease.fence_named('leader', {named})"))
        .await
        .expect_err("the zombie leader is fenced");
    assert_eq!(sqlstate(&fenced).as_deref(), Some("LE001"));
}

/// DDL on an attached table desynchronised it. After renaming
/// the key column new rows got key NULL; TRUNCATE left claimable rows for
/// rows that were gone; after DROP TABLE the queue could not be dropped nor
/// the name attached again; and a predicate literal containing the internal
/// alias text was rewritten.
#[tokio::test]
async fn ddl_on_an_attached_table_is_followed() {
    let cluster = preloaded(&[]);
    let su = cluster.connect().await;
    roles(&su).await;
    let ops = cluster.connect_to(TEST_DB, "ops").await;
    ops.batch_execute(
        "CREATE TABLE items (id text PRIMARY KEY, status text, note text);
         INSERT INTO items VALUES ('a', 'todo', 'pg_lease_attached_row.x');
         SELECT lease.attach('items', $$status = 'todo' AND note IS DISTINCT FROM 'NEW.x'$$);
         ALTER TABLE items RENAME COLUMN id TO ident;
         INSERT INTO items VALUES ('b', 'todo', 'NEW.x'), ('c', 'todo', 'pg_lease_attached_row.x');",
    )
    .await
    .expect("attach, rename, insert");
    let keys: String = scalar(
        &su,
        "SELECT string_agg(coalesce(key, 'NULL'), ',' ORDER BY key) FROM lease.job WHERE queue = 'items'",
    )
    .await;
    assert_eq!(
        keys, "a,c",
        "the literal stays a literal; the renamed key is followed"
    );
    ops.batch_execute("TRUNCATE items").await.expect("truncate");
    let left: i64 = scalar(&su, "SELECT count(*) FROM lease.job WHERE queue = 'items'").await;
    assert_eq!(left, 0, "TRUNCATE ends every row's lease");
    ops.batch_execute(
        "INSERT INTO items VALUES ('d', 'todo', NULL);
         DROP TABLE items;
         CREATE TABLE items (id bigint PRIMARY KEY, status text);
         INSERT INTO items VALUES (1, 'todo');
         SELECT lease.attach('items', $$status = 'todo'$$);",
    )
    .await
    .expect("drop and attach a new table of the same name");
    let keys: String = scalar(
        &su,
        "SELECT string_agg(key, ',') FROM lease.job WHERE queue = 'items'",
    )
    .await;
    assert_eq!(keys, "1");
}

/// Two concurrent `attach` calls on one table: the second
/// failed with 23505 instead of the documented 42710.
#[tokio::test]
async fn concurrent_attach_reports_already_attached() {
    let cluster = preloaded(&[]);
    let su = cluster.connect().await;
    su.batch_execute("CREATE TABLE t (id int PRIMARY KEY, s text)")
        .await
        .expect("table");
    let a = cluster.connect().await;
    let b = cluster.connect().await;
    a.batch_execute("BEGIN; SELECT lease.attach('t', $$s = 'x'$$)")
        .await
        .expect("first attach");
    let second = tokio::spawn(async move {
        b.batch_execute("SELECT lease.attach('t', $$s = 'y'$$)")
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.batch_execute("COMMIT").await.expect("commit");
    let err = second
        .await
        .expect("task")
        .expect_err("second attach fails");
    assert_eq!(sqlstate(&err).as_deref(), Some("42710"), "{err}");
}

/// A session that left `lease.sweep()` open in a transaction
/// made the sweeper of its database wait out its lock timeout every pass,
/// which delayed recovery in every other database by seconds.
#[tokio::test]
async fn a_stuck_database_does_not_delay_the_others() {
    let cluster = preloaded(&[]);
    let su = cluster.connect().await;
    su.batch_execute("CREATE DATABASE stuck").await.expect("db");
    cluster.psql("stuck", "CREATE EXTENSION pg_lease");
    let stuck = cluster.connect_to("stuck", "postgres").await;
    stuck
        .batch_execute("BEGIN; SELECT * FROM lease.sweep()")
        .await
        .expect("a sweep left open");
    su.batch_execute("SELECT lease.enqueue('default', '{}')")
        .await
        .expect("enqueue");
    // Let a few passes run into the stuck database first.
    tokio::time::sleep(Duration::from_millis(500)).await;
    su.batch_execute("SELECT lease.claim_pending(1, '100 ms', 'crashed')")
        .await
        .expect("claim");
    let took = eventually(
        &su,
        "SELECT state = 'pending' FROM lease.job",
        Duration::from_secs(10),
    )
    .await;
    // ttl + interval + slack; on main it took 4 to 7 seconds.
    assert!(
        took < Duration::from_millis(1500),
        "recovered after {took:?}"
    );
}

/// When something else (parallel query of any role) held every
/// worker slot, nothing was swept and only the server log said so. The
/// shortage is counted in `lease.reaper_stats` now. Here the launcher's own
/// slot is the only one.
#[tokio::test]
async fn a_worker_slot_shortage_shows_in_reaper_stats() {
    let cluster = preloaded(&[
        "max_worker_processes = 1",
        "max_logical_replication_workers = 0",
    ]);
    let su = cluster.connect().await;
    eventually(
        &su,
        "SELECT slot_shortages > 0 AND last_slot_shortage_at > now() - interval '1 minute' FROM lease.reaper_stats",
        Duration::from_secs(5),
    )
    .await;
}
