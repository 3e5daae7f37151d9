//! Plain HTTP to the dashboard, as any local process can send it (no
//! browser, no cookie unless given), and a TCP proxy that counts what
//! PostgreSQL sends through it, for the dashboard's limits.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An answer: status, head (status line and headers) and body.
pub struct Answer {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

impl Answer {
    /// The value of header `name` (case-insensitive), if any.
    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// `GET path` of the server at `base` (`http://127.0.0.1:PORT`), with
/// `Cookie: cookie` if given; the whole answer (the server closes the
/// connection after it), within 30 s.
pub async fn get(base: &str, path: &str, cookie: Option<&str>) -> Answer {
    let addr = base.trim_start_matches("http://");
    let cookie = cookie.map_or(String::new(), |c| format!("Cookie: {c}\r\n"));
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{cookie}Connection: close\r\n\r\n");
    let raw = tokio::time::timeout(Duration::from_secs(30), async {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(request.as_bytes()).await.expect("send");
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.expect("read");
        raw
    })
    .await
    .unwrap_or_else(|_| panic!("GET {path}: no whole answer within 30 s"));
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("GET {path}: no head in {:?}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("GET {path}: no status in {head:?}"));
    let mut answer = Answer {
        status,
        head,
        body: raw[split + 4..].to_vec(),
    };
    if answer
        .header("transfer-encoding")
        .is_some_and(|t| t.eq_ignore_ascii_case("chunked"))
    {
        answer.body = unchunk(&answer.body);
    }
    answer
}

/// A chunked body's content.
fn unchunk(mut raw: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    loop {
        let line_end = raw
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("a chunk size line");
        let size = std::str::from_utf8(&raw[..line_end])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next().unwrap_or("").trim(), 16).ok())
            .expect("a chunk size");
        if size == 0 {
            return body;
        }
        let start = line_end + 2;
        body.extend_from_slice(&raw[start..start + size]);
        raw = &raw[start + size + 2..];
    }
}

/// A proxy on 127.0.0.1 in front of a cluster's port that counts the bytes
/// the server sends back; it lives as long as the test's runtime.
pub struct CountingProxy {
    pub port: u16,
    received: Arc<AtomicU64>,
}

impl CountingProxy {
    /// Listens on a free port and forwards each connection to
    /// `127.0.0.1:target`.
    pub async fn start(target: u16) -> CountingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let received = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&received);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else {
                    continue;
                };
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
                });
                let counter = Arc::clone(&counter);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match server_read.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        counter.fetch_add(n as u64, Ordering::SeqCst);
                        if client_write.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        CountingProxy { port, received }
    }

    /// Bytes the server has sent through the proxy so far.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::SeqCst)
    }
}
