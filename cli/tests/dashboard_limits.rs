//! `pg-lease ui` against requests that would make it hold more than a
//! page: large payloads stay in the database but for the part a page
//! shows, memory-costly parameters are bounded, and half-sent requests are
//! closed and capped while others are answered. Plain HTTP from the test,
//! as any local process can send it, and a proxy that counts what
//! PostgreSQL sends the dashboard; the browser where a page shows it.

mod common;

use std::time::{Duration, Instant};

use common::browser::{Browser, Dashboard};
use common::http::{self, CountingProxy};
use pg_tests::{scalar, test_user, Cluster, TEST_DB};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// More than PostgreSQL sends for any page here once payloads stay in the
/// database; the rows below hold megabytes each.
const PAGE_BOUND: u64 = 256 * 1024;

/// The payload's JSON text as PostgreSQL prints it.
async fn payload_text(pg: &tokio_postgres::Client, id: i64) -> String {
    scalar(
        pg,
        &format!("SELECT payload::text FROM lease.job WHERE id = {id}"),
    )
    .await
}

/// The id of the row of key `key`.
async fn id_of(pg: &tokio_postgres::Client, key: &str) -> i64 {
    scalar(pg, &format!("SELECT id FROM lease.job WHERE key = '{key}'")).await
}

/// Three dead letters of 5 MB payloads (highly compressible, so cheap to
/// store) and a pending row of 5 MB were read whole by the dashboard:
/// `/dead` and the queue page selected payloads they never show (15 MB
/// from PostgreSQL for one `/dead`, 20 MB for the queue page), and the row
/// page rendered the whole payload into the page (a 5 MB answer). Now
/// PostgreSQL sends less than 256 KiB for each, the row page shows the
/// payload's first characters with its size and a link to the raw value,
/// which is served whole up to its cap and refused (413) above it without
/// being read; `/dead?limit=` above 1000 is a 400 (it took up to 10000).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_read_only_the_part_of_a_payload_they_show() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute(
        "SELECT lease.create_queue('big', max_payload_bytes => 268435455);
         SELECT lease.enqueue('big', jsonb_build_object('blob', repeat('x', 5000000)), key => 'dead-' || g)
           FROM generate_series(1, 3) g;
         SELECT count(*) FROM lease.claim_pending(3, '1 minute', 'w', 'big') c,
                LATERAL lease.release(c.id, 'w', c.epoch, 'fail', error => 'too big') r;
         SELECT lease.enqueue('big', jsonb_build_object('blob', repeat('x', 5000000)), key => 'huge');
         SELECT lease.enqueue('big', jsonb_build_object('blob', repeat('y', 600000), 'the_tail_key', 'tail-marker'),
                              key => 'medium');
         SELECT lease.enqueue('big', '{\"to\": \"ann@example.com\"}', key => 'small');",
    )
    .await
    .expect("fill");
    let (huge, medium, small) = (
        id_of(&pg, "huge").await,
        id_of(&pg, "medium").await,
        id_of(&pg, "small").await,
    );
    let proxy = CountingProxy::start(cluster.port()).await;
    let url = format!(
        "host=127.0.0.1 port={} user={} dbname={TEST_DB}",
        proxy.port,
        test_user()
    );
    let ui = Dashboard::start(&url, &[]);

    for path in [
        "/dead".to_owned(),
        "/dead?queue=big&limit=1000".to_owned(),
        "/queues/big".to_owned(),
        "/queues/big?state=dead".to_owned(),
        format!("/jobs/{huge}"),
        format!("/jobs/{medium}"),
    ] {
        let before = proxy.received();
        let answer = http::get(&ui.base, &path, None).await;
        let from_db = proxy.received() - before;
        assert_eq!(answer.status, 200, "{path}: {}", answer.text());
        assert!(
            from_db < PAGE_BOUND,
            "{path}: PostgreSQL sent {from_db} bytes for it"
        );
        assert!(
            (answer.body.len() as u64) < PAGE_BOUND,
            "{path}: an answer of {} bytes",
            answer.body.len()
        );
    }

    // The row page: the payload's start, its size, the link to the rest.
    let page = http::get(&ui.base, &format!("/jobs/{huge}"), None)
        .await
        .text();
    assert!(page.contains("{&#34;blob&#34;: &#34;xxxx"), "{page}");
    assert!(page.contains("5000012 bytes"), "the size is shown");
    assert!(page.contains(&format!("pg-lease jobs show {huge}")));
    assert!(
        !page.contains(&format!("href=\"/jobs/{huge}/payload\"")),
        "no link to a payload over the cap"
    );
    // A small payload is shown whole, pretty-printed, without the note.
    let page = http::get(&ui.base, &format!("/jobs/{small}"), None)
        .await
        .text();
    assert!(page.contains("&#34;to&#34;: &#34;ann@example.com&#34;"));
    assert!(!page.contains("class=\"truncated\""), "{page}");

    // The raw value: whole below the cap, refused above it unread.
    let raw = http::get(&ui.base, &format!("/jobs/{medium}/payload"), None).await;
    assert_eq!(raw.status, 200);
    assert!(
        raw.header("content-type")
            .is_some_and(|t| t.starts_with("application/json")),
        "{}",
        raw.head
    );
    assert_eq!(raw.text(), payload_text(&pg, medium).await);
    let before = proxy.received();
    let refused = http::get(&ui.base, &format!("/jobs/{huge}/payload"), None).await;
    assert_eq!(refused.status, 413, "{}", refused.text());
    assert!(refused.text().contains("pg-lease jobs show"));
    assert!(proxy.received() - before < PAGE_BOUND, "read to be refused");

    // Memory-costly parameters are bounded, with a 400 that says how.
    let over = http::get(&ui.base, "/dead?limit=1001", None).await;
    assert_eq!(over.status, 400);
    assert!(
        over.text().contains("between 1 and 1000"),
        "{}",
        over.text()
    );
    for (path, want) in [("/dead?limit=0", 400), ("/dead?limit=x", 400)] {
        assert_eq!(http::get(&ui.base, path, None).await.status, want, "{path}");
    }

    // In the browser: the note, and the link to the whole value.
    let b = Browser::start().await;
    b.goto(&ui.url(&format!("/jobs/{medium}"))).await;
    let note = b.text("p.truncated").await;
    assert!(
        note.contains("16384") && note.contains("600043 bytes"),
        "{note}"
    );
    assert!(!b.text("pre.payload").await.contains("tail-marker"));
    b.screenshot("job-truncated").await;
    b.follow("p.truncated a").await;
    assert_eq!(b.path().await, format!("/jobs/{medium}/payload"));
    assert!(b.source().await.contains("tail-marker"));
    b.close().await;
}

/// Sockets of process `pid`.
fn sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("/proc/PID/fd")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count()
}

/// Waits until the server closes `s` (end of stream or reset), reading
/// whatever it answers first; false if it is still open at `deadline`.
async fn closed_by(s: &mut TcpStream, deadline: Instant) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

/// 200 connections that send half a request head (and a few a whole head
/// but half a body) stayed open for good, each holding a socket of the
/// dashboard: 200 sockets, all still open 20 s later. Now the dashboard
/// holds at most 128 connections at once (the others wait to be
/// accepted), closes a head or body not sent within 5 s, and answers a
/// normal request meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_requests_are_closed_and_capped() {
    let cluster = Cluster::start();
    let ui = Dashboard::start(&cluster.conn_string(TEST_DB), &["--allow-actions"]);
    let addr = ui.base.trim_start_matches("http://").to_owned();
    let opened = Instant::now();
    let mut held = Vec::new();
    for i in 0..200 {
        let mut s = TcpStream::connect(&addr).await.expect("connect");
        let half = if i % 20 == 0 {
            format!(
                "POST /actions/cancel HTTP/1.1\r\nHost: {addr}\r\n\
                 Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\ncsrf="
            )
        } else {
            format!("GET / HTTP/1.1\r\nHost: {addr}\r\nX-Half: ")
        };
        s.write_all(half.as_bytes()).await.expect("send half");
        held.push(s);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let open = sockets(ui.pid());
    // Besides connections: the listener, PostgreSQL, the signal driver's.
    assert!(
        open <= 128 + 8,
        "the dashboard holds {open} sockets for 200 half-sent requests"
    );

    let asked = Instant::now();
    let answer = http::get(&ui.base, "/", None).await;
    assert_eq!(answer.status, 200);
    assert!(
        asked.elapsed() < Duration::from_secs(15),
        "answered after {:?}",
        asked.elapsed()
    );

    let deadline = opened + Duration::from_secs(20);
    for (i, s) in held.iter_mut().enumerate() {
        assert!(
            closed_by(s, deadline).await,
            "half-sent request {i} still open after 20 s"
        );
    }
    let asked = Instant::now();
    assert_eq!(http::get(&ui.base, "/", None).await.status, 200);
    assert!(asked.elapsed() < Duration::from_secs(5), "answered at once");
}
