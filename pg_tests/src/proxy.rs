//! A TCP proxy for fault injection: tests point a client at the proxy
//! instead of the cluster, then pause it (bytes stop flowing both ways, as
//! in a network partition or a frozen peer), hold back only the server's
//! answers (a request reaches the server and commits, its answer is late),
//! or cut it (every open connection is closed, as in a server restart or a
//! dropped NAT entry).
//!
//! ```no_run
//! # async fn example(cluster: &pg_tests::Cluster) {
//! use pg_tests::proxy::Proxy;
//!
//! let proxy = Proxy::start(cluster.port()).await;
//! let conn = proxy.conn_string(pg_tests::TEST_DB);
//! // ... connect through `conn`, then:
//! proxy.pause();
//! proxy.resume();
//! proxy.cut();
//! # }
//! ```

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy holds back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pause {
    Nothing,
    Both,
    Answers,
}

impl Pause {
    /// Whether bytes from the server (`answers`) or to it stop.
    fn holds(self, answers: bool) -> bool {
        self == Pause::Both || (answers && self == Pause::Answers)
    }
}

/// A proxy on 127.0.0.1 in front of a cluster's port. Dropping it closes
/// every connection through it.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    paused: watch::Sender<Pause>,
    cuts: watch::Sender<u64>,
    accepted: Arc<AtomicUsize>,
    acceptor: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free port of 127.0.0.1 and forwards each connection to
    /// `target_port` on 127.0.0.1. Must run inside a tokio runtime; panics
    /// if it cannot bind (test code).
    pub async fn start(target_port: u16) -> Proxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .unwrap_or_else(|e| panic!("pg_tests proxy: could not bind 127.0.0.1:0: {e}"));
        let port = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("pg_tests proxy: no local address: {e}"))
            .port();
        let (paused, _) = watch::channel(Pause::Nothing);
        let (cuts, _) = watch::channel(0u64);
        let accepted = Arc::new(AtomicUsize::new(0));
        let acceptor = {
            let paused = paused.clone();
            let cuts = cuts.clone();
            let accepted = Arc::clone(&accepted);
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    accepted.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(forward(
                        client,
                        target_port,
                        paused.subscribe(),
                        cuts.subscribe(),
                    ));
                }
            })
        };
        Proxy {
            port,
            paused,
            cuts,
            accepted,
            acceptor,
        }
    }

    /// Port the proxy listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Connection string for database `db` as the superuser, through the
    /// proxy.
    pub fn conn_string(&self, db: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user={} dbname={db}",
            self.port,
            crate::SUPERUSER
        )
    }

    /// Stops forwarding bytes in both directions on every connection, open
    /// or new; nothing is closed. Requests hang, as in a partition.
    pub fn pause(&self) {
        self.paused.send_replace(Pause::Both);
    }

    /// Stops forwarding what the server sends, on every connection; what
    /// clients send still reaches it. A request is carried out, and its
    /// answer waits (a new connection's start-up waits too).
    pub fn hold_answers(&self) {
        self.paused.send_replace(Pause::Answers);
    }

    /// Forwards again, including the bytes held back meanwhile.
    pub fn resume(&self) {
        self.paused.send_replace(Pause::Nothing);
    }

    /// Closes every connection currently open through the proxy; new ones
    /// are accepted as before.
    pub fn cut(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }

    /// How many connections the proxy has accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.acceptor.abort();
        self.cut();
    }
}

async fn forward(
    client: TcpStream,
    target_port: u16,
    paused: watch::Receiver<Pause>,
    mut cuts: watch::Receiver<u64>,
) {
    let Ok(server) = TcpStream::connect((Ipv4Addr::LOCALHOST, target_port)).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    // Either direction ending, a cut, or the proxy going away closes both.
    tokio::select! {
        () = pipe(client_read, server_write, paused.clone(), false) => {}
        () = pipe(server_read, client_write, paused, true) => {}
        _ = cuts.changed() => {}
    }
}

/// Copies `from` to `to` while the pause lets this direction (the server's
/// `answers`, or the client's requests) through.
async fn pipe(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut paused: watch::Receiver<Pause>,
    answers: bool,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        // Hold back before reading too, so nothing moves while paused.
        while paused.borrow_and_update().holds(answers) {
            if paused.changed().await.is_err() {
                return;
            }
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while paused.borrow_and_update().holds(answers) {
            if paused.changed().await.is_err() {
                return;
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
