//! `pg-lease ui` in a real browser: Debian's chromium, headless, driven
//! through chromedriver. Every page loads and its links lead on; the
//! actions change the database and a role without the grant sees the
//! refusal; bad input, a foreign Host and a database that goes away get
//! their own pages. Screenshots land in target/dashboard/.

mod common;

use std::time::Duration;

use common::browser::{Browser, Dashboard};
use common::url_as;
use pg_tests::{scalar, Cluster, TEST_DB};

/// Queues in every state: `emails` with pending (keys welcome-1..3),
/// delayed, leased and dead rows, `bulk` with 120 pending rows, a
/// schedule, a named lease. Returns the dead row's id.
async fn fill(pg: &tokio_postgres::Client) -> i64 {
    pg.batch_execute("SELECT lease.create_queue('emails'); SELECT lease.create_queue('bulk');")
        .await
        .expect("queues");
    // First, so that it is the head of the queue the claim takes.
    let dead: i64 = scalar(
        pg,
        "SELECT c.id FROM lease.enqueue('emails', '{\"to\": \"bad@example.com\"}', key => 'bounce'),
                LATERAL lease.claim_pending(1, '1 minute', 'api-7f9c', 'emails') c,
                LATERAL lease.release(c.id, 'api-7f9c', c.epoch, 'fail', error => 'smtp: 550 mailbox unavailable') r",
    )
    .await;
    pg.batch_execute(
        "SELECT lease.enqueue('emails', jsonb_build_object('to', 'ann@example.com', 'n', g), key => 'welcome-' || g)
           FROM generate_series(1, 3) g;
         SELECT lease.enqueue('emails', '{\"later\": true}', run_at => now() + interval '1 hour');
         SELECT lease.enqueue('bulk', jsonb_build_object('n', g)) FROM generate_series(1, 120) g;
         SELECT lease.schedule('nightly-report', 'bulk', cron => '0 3 * * *');
         SELECT lease.try_acquire('housekeeper', 'api-2b1d', '10 minutes');",
    )
    .await
    .expect("fill");
    // One leased row: welcome-1, the head of the queue now.
    let _: i64 = scalar(
        pg,
        "SELECT count(*) FROM lease.claim_pending(1, '5 minutes', 'api-2b1d', 'emails')",
    )
    .await;
    dead
}

/// The state of row `id`.
async fn state(pg: &tokio_postgres::Client, id: i64) -> String {
    scalar(
        pg,
        &format!("SELECT state::text FROM lease.job WHERE id = {id}"),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_loads_and_its_links_lead_on() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    let dead = fill(&pg).await;
    // A password in the connection string must not reach any page (trust
    // authentication ignores it).
    let url = format!("{} password=s3cret-w0rd", cluster.conn_string(TEST_DB));
    let ui = Dashboard::start(&url, &[]);
    let b = Browser::start().await;

    b.goto(&ui.url("/")).await;
    assert_eq!(
        b.text("tr[data-queue=emails] td:nth-child(2)").await,
        "2",
        "ready"
    );
    assert_eq!(
        b.text("tr[data-queue=emails] td:nth-child(3)").await,
        "1",
        "delayed"
    );
    assert_eq!(
        b.text("tr[data-queue=emails] td:nth-child(4)").await,
        "1",
        "leased"
    );
    assert_eq!(
        b.text("tr[data-queue=emails] td:nth-child(6)").await,
        "1",
        "dead"
    );
    assert_eq!(b.text("tr[data-queue=bulk] td:nth-child(2)").await, "120");
    assert!(
        b.source().await.contains(TEST_DB),
        "the header names the database"
    );

    // The table refreshes itself: a new row shows up without a reload.
    pg.batch_execute("SELECT lease.enqueue('bulk', '{}')")
        .await
        .expect("enqueue");
    pg_tests::until(
        "the queues table refreshes",
        Duration::from_secs(15),
        || async { b.text("tr[data-queue=bulk] td:nth-child(2)").await == "121" },
    )
    .await;
    assert_eq!(b.path().await, "/", "refreshed in place");
    b.screenshot("queues").await;

    // Queue page, its rows, one row.
    b.follow("tr[data-queue=emails] td a").await;
    assert_eq!(b.path().await, "/queues/emails");
    assert_eq!(b.count("table.jobs tbody tr").await, 5);
    assert!(b.source().await.contains("welcome-2"));
    b.screenshot("queue").await;
    b.follow(&format!("table.jobs a[href='/jobs/{dead}']"))
        .await;
    assert_eq!(b.path().await, format!("/jobs/{dead}"));
    let page = b.source().await;
    for text in [
        "bad@example.com",
        "smtp: 550 mailbox unavailable",
        "api-7f9c",
        "dead",
    ] {
        assert!(page.contains(text), "job page shows {text:?}");
    }
    b.screenshot("job").await;
    b.follow("h1 small a").await;
    assert_eq!(b.path().await, "/queues/emails");

    // The state filter, through the form.
    b.choose("select[name=state]", "dead").await;
    b.follow("form.filters button").await;
    b.wait_path("/queues/emails?state=dead").await;
    assert_eq!(b.count("table.jobs tbody tr").await, 1);
    assert_eq!(b.text("table.jobs td.state").await, "dead");

    // The key filter finds one row through the key index.
    b.goto(&ui.url("/queues/emails?key=welcome-3")).await;
    assert_eq!(b.count("table.jobs tbody tr").await, 1);
    assert!(b.source().await.contains("welcome-3"));

    // Paging: 121 rows of bulk are 50 + 50 + 21, ids rising across pages.
    b.goto(&ui.url("/queues/bulk")).await;
    let mut seen = Vec::new();
    loop {
        let ids = b
            .client
            .find_all(fantoccini::Locator::Css("table.jobs td.n a"))
            .await
            .expect("ids");
        for id in ids {
            seen.push(
                id.text()
                    .await
                    .expect("id")
                    .parse::<i64>()
                    .expect("numeric id"),
            );
        }
        if b.count("a.next").await == 0 {
            break;
        }
        b.follow("a.next").await;
    }
    assert_eq!(seen.len(), 121);
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "ids rise across pages"
    );

    // The other pages.
    b.goto(&ui.url("/")).await;
    b.follow("nav a[href='/dead']").await;
    assert!(b.source().await.contains(&format!("/jobs/{dead}")));
    b.follow("nav a[href='/schedules']").await;
    assert!(b.text("table.schedules").await.contains("nightly-report"));
    b.follow("nav a[href='/leases']").await;
    assert!(b.text("table.holders").await.contains("api-2b1d"));
    b.follow("nav a[href='/reaper']").await;
    assert!(b.text("table.fields").await.contains("sweeps"));

    // Without --allow-actions: no forms, and a POST is refused unchanged.
    for path in ["/", "/queues/emails", &format!("/jobs/{dead}"), "/dead"] {
        b.goto(&ui.url(path)).await;
        assert_eq!(b.count("form[method=post]").await, 0, "{path}");
        assert!(
            !b.source().await.contains("s3cret-w0rd"),
            "{path} shows the password"
        );
    }
    let status = b
        .fetch_status("POST", "/actions/requeue", &format!("csrf=x&id={dead}"))
        .await;
    assert_eq!(status, 403);
    assert_eq!(state(&pg, dead).await, "dead");

    b.close().await;
}

/// Deliberate breaks this suite was run against: `actions::requeue`
/// answering "requeued" without calling `lease.requeue` (the state check
/// fails), `actions::cancel` likewise, and `accept` without the token
/// comparison (the foreign-token POST succeeds and the row changes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actions_change_the_database_and_need_this_servers_token() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    let dead = fill(&pg).await;
    let ui = Dashboard::start(&cluster.conn_string(TEST_DB), &["--allow-actions"]);
    let b = Browser::start().await;

    // Requeue a dead letter from its page.
    b.goto(&ui.url(&format!("/jobs/{dead}"))).await;
    let token = csrf(&b).await;
    b.follow("#requeue").await;
    assert!(
        b.text("p.done").await.contains("requeued"),
        "{}",
        b.source().await
    );
    assert_eq!(state(&pg, dead).await, "pending");
    let attempts: i32 = scalar(
        &pg,
        &format!("SELECT attempt FROM lease.job WHERE id = {dead}"),
    )
    .await;
    assert_eq!(attempts, 0, "attempts reset");

    // Cancel a pending row from its page.
    let pending: i64 = scalar(&pg, "SELECT id FROM lease.job WHERE key = 'welcome-2'").await;
    b.goto(&ui.url(&format!("/jobs/{pending}"))).await;
    b.follow("#cancel").await;
    assert!(b.text("p.done").await.starts_with("Cancelled"));
    assert_eq!(state(&pg, pending).await, "cancelled");
    // A finished row: nothing to do, said so (409), nothing changed.
    let finished: i64 = scalar(
        &pg,
        "SELECT c.id FROM lease.claim_pending(1, '1 minute', 'w', 'bulk') c,
                LATERAL lease.release(c.id, 'w', c.epoch, 'fail') r",
    )
    .await;
    let status = b
        .fetch_status(
            "POST",
            "/actions/cancel",
            &format!("csrf={token}&id={finished}"),
        )
        .await;
    assert_eq!(status, 409);
    assert_eq!(state(&pg, finished).await, "dead");

    // Cancel by key from the queue page.
    let by_key: i64 = scalar(&pg, "SELECT id FROM lease.job WHERE key = 'welcome-3'").await;
    b.goto(&ui.url("/queues/emails")).await;
    b.type_into(
        "form[action='/actions/cancel-key'] input[name=key]",
        "welcome-3",
    )
    .await;
    b.follow("form[action='/actions/cancel-key'] button").await;
    assert_eq!(state(&pg, by_key).await, "cancelled");
    // A key with no row: said so in words (it read "there is no the row of
    // key ..." before).
    b.goto(&ui.url("/queues/emails")).await;
    b.type_into("form[action='/actions/cancel-key'] input[name=key]", "nope")
        .await;
    b.follow("form[action='/actions/cancel-key'] button").await;
    let missing = b.text("main").await;
    assert!(
        missing.contains("emails has no row of key \"nope\""),
        "{missing}"
    );

    // Pause a queue from its page: the queues table and the queue page say
    // so, claims get nothing, and the same page resumes it. Failed first:
    // neither page showed a paused queue, and there was no such action.
    b.goto(&ui.url("/queues/bulk")).await;
    assert_eq!(b.count(".badge.paused").await, 0);
    b.follow("form[action='/actions/pause'] button").await;
    assert!(b.text("p.done").await.starts_with("Paused bulk"));
    let paused = "SELECT paused FROM lease.queue WHERE name = 'bulk'";
    assert!(scalar::<bool>(&pg, paused).await);
    b.goto(&ui.url("/")).await;
    assert_eq!(b.text("tr[data-queue=bulk] .badge").await, "paused");
    assert_eq!(b.count("tr[data-queue=emails] .badge").await, 0);
    b.goto(&ui.url("/queues/bulk")).await;
    assert_eq!(b.text("h1 .badge.paused").await, "paused");
    b.screenshot("queue_paused").await;
    b.follow("form[action='/actions/resume'] button").await;
    assert!(b.text("p.done").await.starts_with("Resumed bulk"));
    assert!(!scalar::<bool>(&pg, paused).await);

    // A rate limit and what claims used of it.
    assert_eq!(b.count("p.rate").await, 0, "no limit, no line");
    pg.batch_execute(
        "SELECT lease.create_queue('bulk', rate_limit => 500, rate_period => '1 hour');
         SELECT lease.claim_pending(3, '1 minute', 'w', 'bulk');",
    )
    .await
    .expect("a limit, and a claim under it");
    b.goto(&ui.url("/queues/bulk")).await;
    assert_eq!(
        b.text("p.rate").await,
        "Rate limit: 500 rows per 1 h; 3 claimed in the last 1 h."
    );

    // Purge the dead letters of bulk (the one above): the box must be ticked.
    let unticked = b
        .fetch_status(
            "POST",
            "/actions/purge-dead",
            &format!("csrf={token}&queue=bulk"),
        )
        .await;
    assert_eq!(unticked, 400);
    b.goto(&ui.url("/queues/bulk")).await;
    b.click("form[action='/actions/purge-dead'] input[name=yes]")
        .await;
    b.follow("form[action='/actions/purge-dead'] button").await;
    assert!(b.text("p.done").await.contains("Deleted 1 dead letters"));
    let left: i64 = scalar(
        &pg,
        "SELECT count(*) FROM lease.job WHERE queue = 'bulk' AND state = 'dead'",
    )
    .await;
    assert_eq!(left, 0);

    // A form of another server (another token) changes nothing.
    let other: i64 = scalar(
        &pg,
        "SELECT id FROM lease.job WHERE queue = 'bulk' AND state = 'pending' LIMIT 1",
    )
    .await;
    let foreign = b
        .fetch_status(
            "POST",
            "/actions/cancel",
            &format!("csrf={}&id={other}", "0".repeat(32)),
        )
        .await;
    assert_eq!(foreign, 403);
    assert_eq!(state(&pg, other).await, "pending");

    b.close().await;
}

/// The token of the current page's first action form.
async fn csrf(b: &Browser) -> String {
    b.client
        .find(fantoccini::Locator::Css("input[name=csrf]"))
        .await
        .expect("a form with a token")
        .attr("value")
        .await
        .expect("value")
        .expect("a token")
}

/// A read-only role (`pg_read_all_data`, the function the metrics view
/// calls) sees every page; its requeue and cancel are refused by the
/// database, the page shows SQLSTATE 42501, and nothing changes. A
/// `lease_admin`, who may not read `lease.job`, is told so on a queue page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_without_the_grant_sees_the_refusal() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    let dead = fill(&pg).await;
    pg.batch_execute(
        "CREATE ROLE viewer LOGIN IN ROLE pg_read_all_data;
         GRANT EXECUTE ON FUNCTION lease._queue_head(text) TO viewer;
         CREATE ROLE ops LOGIN IN ROLE lease_admin;",
    )
    .await
    .expect("roles");
    let ui = Dashboard::start(&url_as(&cluster, TEST_DB, "viewer"), &["--allow-actions"]);
    let b = Browser::start().await;

    b.goto(&ui.url("/")).await;
    assert_eq!(b.text("tr[data-queue=emails] td:nth-child(6)").await, "1");
    b.goto(&ui.url("/dead")).await;
    b.follow(&format!(
        "form[action='/actions/requeue'] input[value='{dead}'] ~ button"
    ))
    .await;
    assert_eq!(b.text("h1").await, "Refused by the database");
    assert_eq!(b.text("code.sqlstate").await, "42501");
    assert_eq!(state(&pg, dead).await, "dead");

    let pending: i64 = scalar(&pg, "SELECT id FROM lease.job WHERE key = 'welcome-2'").await;
    b.goto(&ui.url(&format!("/jobs/{pending}"))).await;
    b.follow("#cancel").await;
    assert_eq!(b.text("code.sqlstate").await, "42501");
    assert_eq!(state(&pg, pending).await, "pending");
    drop(ui);

    // lease_admin: the counts and the actions, not the rows.
    let ui = Dashboard::start(&url_as(&cluster, TEST_DB, "ops"), &["--allow-actions"]);
    b.goto(&ui.url("/queues/emails")).await;
    assert!(b.text("p.refused").await.contains("42501"));
    assert_eq!(b.count("table.jobs").await, 0);

    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_a_foreign_host_and_a_database_that_goes_away() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    fill(&pg).await;
    drop(pg);
    let ui = Dashboard::start(&cluster.conn_string(TEST_DB), &[]);
    let b = Browser::start().await;
    b.goto(&ui.url("/")).await;

    for (path, want) in [
        ("/queues/nope", 404),
        ("/jobs/999999999", 404),
        ("/jobs/abc", 400),
        ("/jobs/-1", 400),
        ("/queues/emails?state=bogus", 400),
        ("/queues/emails?after=x", 400),
        ("/dead?queue=nope", 404),
        ("/dead?limit=0", 400),
        ("/nowhere", 404),
        ("/assets/nope.js", 404),
    ] {
        assert_eq!(b.fetch_status("GET", path, "").await, want, "{path}");
    }
    b.goto(&ui.url("/queues/nope")).await;
    assert_eq!(b.text("h1").await, "Not found");

    // DNS rebinding: a page of another name pointed at this address.
    assert_eq!(ui.status_with_host("/", "evil.example:8420"), 403);
    assert_eq!(ui.status_with_host("/", "localhost"), 200);
    // Behind a reverse proxy: its name is answered when given, and only
    // then, exactly. (Failed before --allow-host existed: the option was
    // refused, and a proxied dashboard answered 403 to every request.)
    let proxied = Dashboard::start(
        &cluster.conn_string(TEST_DB),
        &["--allow-host", "Dash.Internal"],
    );
    assert_eq!(proxied.status_with_host("/", "dash.internal:443"), 200);
    assert_eq!(
        proxied.status_with_host("/", "dash.internal.evil.example"),
        403
    );
    assert_eq!(ui.status_with_host("/", "dash.internal"), 403);
    drop(proxied);

    // The database goes away under an open queues page: its table says
    // it is stale and why, and comes back in place. (Failed before: the
    // page kept the last table and said nothing.)
    b.goto(&ui.url("/")).await;
    assert_eq!(b.count("p.stale:not([hidden])").await, 0);
    cluster.crash();
    pg_tests::until(
        "the open page says its table is stale",
        Duration::from_secs(20),
        || async { b.count("p.stale:not([hidden])").await == 1 },
    )
    .await;
    let stale = b.text("p.stale").await;
    assert!(
        stale.contains("Not refreshed since") && stale.contains("Database unreachable"),
        "{stale}"
    );
    b.screenshot("queues-stale").await;
    cluster.restart_immediate();
    pg_tests::until(
        "the open page refreshes again",
        Duration::from_secs(30),
        || async { b.count("p.stale:not([hidden])").await == 0 },
    )
    .await;
    assert_eq!(b.text("tr[data-queue=bulk] td:nth-child(2)").await, "120");

    // A page loaded while the database is away says so, then recovery.
    cluster.crash();
    b.goto(&ui.url("/")).await;
    assert_eq!(b.text("h1").await, "Database unreachable");
    assert_eq!(b.fetch_status("GET", "/", "").await, 503);
    cluster.restart_immediate();
    pg_tests::until(
        "the dashboard recovers",
        Duration::from_secs(30),
        || async { b.fetch_status("GET", "/", "").await == 200 },
    )
    .await;
    b.goto(&ui.url("/")).await;
    assert_eq!(b.text("tr[data-queue=bulk] td:nth-child(2)").await, "120");

    b.close().await;
}

/// Queues named `.` and `..` are reached by their links. A browser reads
/// such a path segment as "this directory" or "the one above", encoded or
/// not, so before the fix their links led to `/queues/` (404) and to the
/// queues page: the rows, filters, paging and actions of those queues could
/// not be reached from any page. Their links carry the name in the query.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_named_like_dot_segments_are_reached_by_their_links() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute(
        "SELECT lease.create_queue('.'); SELECT lease.create_queue('..');
         SELECT lease.enqueue('.', '{}', key => 'only');
         SELECT lease.enqueue('..', jsonb_build_object('n', g), key => 'k-' || g)
           FROM generate_series(1, 51) g;",
    )
    .await
    .expect("fill");
    let ui = Dashboard::start(&cluster.conn_string(TEST_DB), &["--allow-actions"]);
    let b = Browser::start().await;

    for (name, rows) in [(".", 1), ("..", 50)] {
        b.goto(&ui.url("/")).await;
        b.follow(&format!("tr[data-queue='{name}'] td a")).await;
        assert_eq!(b.text("h1 .name").await, name, "at {}", b.path().await);
        assert_eq!(b.count("table.jobs tbody tr").await, rows, "{name}");
    }
    // On "..": the next page, the state filter, a row and back, cancel by key.
    b.follow("a.next").await;
    assert_eq!(b.text("h1 .name").await, "..");
    assert_eq!(b.count("table.jobs tbody tr").await, 1, "page 2");
    b.choose("select[name=state]", "pending").await;
    b.follow("form.filters button").await;
    assert_eq!(b.text("h1 .name").await, "..", "filtered");
    assert_eq!(b.count("table.jobs tbody tr").await, 50);
    b.follow("table.jobs td.n a").await;
    b.follow("h1 small a").await;
    assert_eq!(b.text("h1 .name").await, "..", "back from a row");
    b.type_into("form[action='/actions/cancel-key'] input[name=key]", "k-7")
        .await;
    b.follow("form[action='/actions/cancel-key'] button").await;
    assert!(b.text("p.done").await.starts_with("Cancelled"));
    b.follow("p a").await;
    assert_eq!(b.text("h1 .name").await, "..", "back from the action");

    b.close().await;
}
