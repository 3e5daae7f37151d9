//! `pg-lease ui --login`: the dashboard closed to the other users of the
//! machine, in a real browser and from plain HTTP.

mod common;

use common::browser::{Browser, Dashboard};
use common::http;
use pg_tests::{scalar, Cluster, TEST_DB};

/// Any local user could reach the dashboard on 127.0.0.1 and read the
/// payloads and the form token from its pages, then act with it; there
/// was no way to close it (`--login` was refused as an unknown option, so
/// the dashboard did not start). Now, with `--login`, a browser or process
/// without the login cookie gets the 401 page on every path (assets
/// aside), which holds neither a payload nor the token, and a wrong token
/// logs nobody in; the link printed at start sets an HttpOnly,
/// SameSite=Strict cookie, after which every page and action works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_login_nothing_is_readable_without_it() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    let dead: i64 = scalar(
        &pg,
        "SELECT c.id FROM lease.create_queue('emails') q,
                LATERAL lease.enqueue('emails', '{\"to\": \"secret-payload@example.com\"}') e,
                LATERAL lease.claim_pending(1, '1 minute', 'w', 'emails') c,
                LATERAL lease.release(c.id, 'w', c.epoch, 'fail', error => 'bounced') r",
    )
    .await;
    let state = || async {
        scalar::<String>(
            &pg,
            &format!("SELECT state::text FROM lease.job WHERE id = {dead}"),
        )
        .await
    };
    let ui = Dashboard::start(
        &cluster.conn_string(TEST_DB),
        &["--login", "--allow-actions"],
    );
    let login = ui
        .login
        .clone()
        .expect("the start-up line offers a login link");
    assert!(
        login.starts_with(&format!("{}/login?token=", ui.base)),
        "{login}"
    );
    let b = Browser::start().await;

    // Without the cookie: the login page everywhere, for the browser and
    // for any other process.
    let mut seen = String::new();
    let paths = [
        "/".to_owned(),
        "/fragments/queues".to_owned(),
        "/queues/emails".to_owned(),
        format!("/jobs/{dead}"),
        format!("/jobs/{dead}/payload"),
        "/dead".to_owned(),
        "/schedules".to_owned(),
        "/leases".to_owned(),
        "/reaper".to_owned(),
        "/nowhere".to_owned(),
    ];
    for path in &paths {
        b.goto(&ui.url(path)).await;
        assert_eq!(b.text("h1").await, "Log in first", "{path}");
        assert_eq!(b.fetch_status("GET", path, "").await, 401, "{path}");
        seen.push_str(&b.source().await);
        let answer = http::get(&ui.base, path, None).await;
        assert_eq!(answer.status, 401, "{path}");
        seen.push_str(&answer.text());
    }
    b.screenshot("login-needed").await;
    assert!(!seen.contains("secret-payload"), "a payload before login");
    // A wrong token, and an action, change nothing.
    let wrong = format!("/login?token={}", "0".repeat(32));
    assert_eq!(b.fetch_status("GET", &wrong, "").await, 401);
    assert_eq!(b.fetch_status("GET", "/", "").await, 401, "still out");
    let post = b
        .fetch_status("POST", "/actions/requeue", &format!("csrf=x&id={dead}"))
        .await;
    assert_eq!(post, 401);
    assert_eq!(state().await, "dead");
    // The stylesheet and script hold nothing and style the login page.
    assert_eq!(b.fetch_status("GET", "/assets/app.css", "").await, 200);

    // The link logs in, and leaves the token out of the address bar.
    b.goto(&login).await;
    assert_eq!(b.path().await, "/");
    assert_eq!(b.text("tr[data-queue=emails] td:nth-child(6)").await, "1");
    let cookies = b.client.get_all_cookies().await.expect("cookies");
    let cookie = cookies
        .iter()
        .find(|c| c.name().starts_with("pg_lease_ui"))
        .unwrap_or_else(|| panic!("no login cookie in {cookies:?}"));
    assert_eq!(cookie.http_only(), Some(true), "{cookie:?}");
    assert_eq!(format!("{:?}", cookie.same_site()), "Some(Strict)");

    // Everything reads and acts now.
    for path in &paths[..paths.len() - 1] {
        assert_eq!(b.fetch_status("GET", path, "").await, 200, "{path}");
    }
    b.goto(&ui.url(&format!("/jobs/{dead}"))).await;
    assert!(b.source().await.contains("secret-payload@example.com"));
    let token = b
        .client
        .find(fantoccini::Locator::Css("input[name=csrf]"))
        .await
        .expect("a form")
        .attr("value")
        .await
        .expect("value")
        .expect("a token");
    assert!(!seen.contains(&token), "the form token before login");
    b.follow("#requeue").await;
    assert!(b.text("p.done").await.contains("requeued"));
    assert_eq!(state().await, "pending");

    // The cookie is the login, whoever sends it; a made-up one is not.
    let (name, value) = (cookie.name().to_owned(), cookie.value().to_owned());
    let with = http::get(&ui.base, "/dead", Some(&format!("{name}={value}"))).await;
    assert_eq!(with.status, 200);
    let forged = format!("{name}={}", "0".repeat(value.len()));
    assert_eq!(
        http::get(&ui.base, "/dead", Some(&forged)).await.status,
        401
    );

    b.close().await;
}
