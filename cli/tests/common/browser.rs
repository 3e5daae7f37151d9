//! `pg-lease ui` as a child process, and Debian's chromium driven headless
//! through chromedriver (WebDriver), for the dashboard suite.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

/// Where Debian's packages put them (`bin/prereqs` installs both).
const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// A running `pg-lease ui`; dropping it kills it.
pub struct Dashboard {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// With `--login`: the link the start-up line offers to log in.
    pub login: Option<String>,
}

impl Dashboard {
    /// Starts `pg-lease --url URL ui --listen 127.0.0.1:0 EXTRA...` and
    /// waits for the line that says where it listens.
    pub fn start(url: &str, extra: &[&str]) -> Dashboard {
        let mut child = Command::new(env!("CARGO_BIN_EXE_pg-lease"))
            .env_remove("PG_LEASE_URL")
            .env_remove("DATABASE_URL")
            .args(["--url", url, "ui", "--listen", "127.0.0.1:0"])
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .expect("start pg-lease ui");
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = BufReader::new(stderr).lines();
        let (base, login) = loop {
            let line = match lines.next() {
                Some(Ok(line)) => line,
                other => panic!("pg-lease ui ended before serving: {other:?}"),
            };
            let after = |marker: &str| {
                let rest = line.split(marker).nth(1)?;
                rest.split_whitespace().next().map(str::to_owned)
            };
            if let Some(url) = after("serving ") {
                break (url.trim_end_matches('/').to_owned(), after("log in at "));
            }
        };
        // Keep draining stderr so the child never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines.by_ref() {});
        Dashboard { child, base, login }
    }

    /// The process id of `pg-lease ui`.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The absolute URL of `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The status line's code of a raw `GET path` with this Host header:
    /// what a browser cannot send (it sets Host itself).
    pub fn status_with_host(&self, path: &str, host: &str) -> u16 {
        let addr = self.base.trim_start_matches("http://");
        let mut s = TcpStream::connect(addr).expect("connect");
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        )
        .expect("send");
        let mut answer = String::new();
        s.read_to_string(&mut answer).expect("read");
        answer
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {answer:?}"))
    }
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Headless chromium under chromedriver; `close` ends both.
pub struct Browser {
    driver: Child,
    /// The WebDriver session.
    pub client: Client,
    _profile: TempDir,
}

impl Browser {
    /// Starts chromedriver on a free port and a headless chromium session
    /// with an empty profile. Panics, naming `bin/prereqs`, if either is
    /// missing.
    pub async fn start() -> Browser {
        for program in [CHROMIUM, CHROMEDRIVER] {
            assert!(
                std::path::Path::new(program).exists(),
                "{program} is missing: bin/prereqs installs Debian's chromium and chromium-driver"
            );
        }
        let port = free_port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let profile = TempDir::new();
        let caps = json!({
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                // The flags that keep chromium from calling out of a closed
                // network and from needing a sandbox when run as root.
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--no-first-run", "--window-size=1280,900",
                    format!("--user-data-dir={}", profile.0.display()),
                ],
            }
        });
        let Value::Object(caps) = caps else {
            unreachable!()
        };
        let started = Instant::now();
        let client = loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(caps.clone())
                .connect(&format!("http://127.0.0.1:{port}"))
                .await
            {
                Ok(client) => break client,
                Err(e) if started.elapsed() < Duration::from_secs(30) => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("no WebDriver session from chromedriver: {e}"),
            }
        };
        Browser {
            driver,
            client,
            _profile: profile,
        }
    }

    /// Goes to `url`.
    pub async fn goto(&self, url: &str) {
        self.client.goto(url).await.expect("goto");
    }

    /// The text of the first element matching `css`. Found again if it
    /// goes stale in between: the queues table is replaced every 5 s.
    pub async fn text(&self, css: &str) -> String {
        for _ in 0..3 {
            match self.client.find(Locator::Css(css)).await {
                Ok(element) => match element.text().await {
                    Ok(text) => return text,
                    Err(_) => continue,
                },
                Err(e) => panic!("no {css} ({e}) in\n{}", self.source().await),
            }
        }
        panic!("{css} went stale three times in a row")
    }

    /// How many elements match `css`.
    pub async fn count(&self, css: &str) -> usize {
        self.client
            .find_all(Locator::Css(css))
            .await
            .expect("find_all")
            .len()
    }

    /// Clicks the first element matching `css`.
    pub async fn click(&self, css: &str) {
        match self.client.find(Locator::Css(css)).await {
            Ok(element) => element.click().await.expect("click"),
            Err(e) => panic!("no {css} ({e}) in\n{}", self.source().await),
        }
    }

    /// Types `text` into the first element matching `css`.
    pub async fn type_into(&self, css: &str, text: &str) {
        match self.client.find(Locator::Css(css)).await {
            Ok(element) => element.send_keys(text).await.expect("type"),
            Err(e) => panic!("no {css} ({e}) in\n{}", self.source().await),
        }
    }

    /// Chooses the option of value `value` in the first `<select>`
    /// matching `css`.
    pub async fn choose(&self, css: &str, value: &str) {
        match self.client.find(Locator::Css(css)).await {
            Ok(element) => element.select_by_value(value).await.expect("choose"),
            Err(e) => panic!("no {css} ({e}) in\n{}", self.source().await),
        }
    }

    /// Clicks the first element matching `css` (a link or a submit button)
    /// and waits until the next page has loaded: the old page's elements
    /// would otherwise still answer, or go stale under a query.
    pub async fn follow(&self, css: &str) {
        self.client
            .execute("window.pgLeaseOldPage = true;", vec![])
            .await
            .expect("mark the page");
        self.click(css).await;
        let started = Instant::now();
        loop {
            let loaded = self
                .client
                .execute(
                    "return window.pgLeaseOldPage === undefined && document.readyState === 'complete';",
                    vec![],
                )
                .await
                .ok()
                .and_then(|v| v.as_bool())
                .unwrap_or(false);
            if loaded {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "clicking {css} led to no new page"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The page's path and query.
    pub async fn path(&self) -> String {
        let url = self.client.current_url().await.expect("url");
        match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_owned(),
        }
    }

    /// Waits up to 10 s for the page's path and query to start with
    /// `prefix` (a click's navigation may still be under way), and
    /// returns it.
    pub async fn wait_path(&self, prefix: &str) -> String {
        let started = Instant::now();
        loop {
            let path = self.path().await;
            if path.starts_with(prefix) {
                return path;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "still at {path}, not {prefix}..."
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The page's HTML.
    pub async fn source(&self) -> String {
        self.client.source().await.expect("source")
    }

    /// The status of `fetch(path, {method, body})` from the current page,
    /// with a form body: what a script of this origin would get.
    pub async fn fetch_status(&self, method: &str, path: &str, body: &str) -> u16 {
        let script = "const done = arguments[arguments.length - 1];
            const init = { method: arguments[0], cache: 'no-store' };
            if (arguments[0] === 'POST') {
              init.body = arguments[2];
              init.headers = { 'content-type': 'application/x-www-form-urlencoded' };
            }
            fetch(arguments[1], init).then(r => done(r.status), () => done(0));";
        let status = self
            .client
            .execute_async(script, vec![json!(method), json!(path), json!(body)])
            .await
            .expect("fetch");
        status.as_u64().expect("a status") as u16
    }

    /// Writes a PNG of the page to target/dashboard/NAME.png.
    pub async fn screenshot(&self, name: &str) {
        let png = self.client.screenshot().await.expect("screenshot");
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/dashboard");
        std::fs::create_dir_all(&dir).expect("target/dashboard");
        std::fs::write(dir.join(format!("{name}.png")), png).expect("write screenshot");
    }

    /// Ends the session and chromedriver.
    pub async fn close(self) {
        let _ = self.client.clone().close().await;
    }
}

impl Drop for Browser {
    /// A test that panics never reaches `close`: chromedriver (and the
    /// chromium it started) must not outlive it.
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// A port nobody listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// A directory under the system's temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir =
            std::env::temp_dir().join(format!("pg_lease_chromium_{}_{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("profile dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
