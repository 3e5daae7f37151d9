//! Opening connections: a [`Connector`] knows how to open a new one, which
//! lets [`Client`](crate::Client), [`Worker`](crate::Worker) and
//! [`Elector`](crate::Elector) reconnect on their own and open a second
//! connection for `LISTEN`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::poll_fn;
use tokio::sync::mpsc;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::types::Type;
use tokio_postgres::{AsyncMessage, Notification, Socket};

use crate::error::{Error, Result};

/// Default time allowed for opening a connection (TCP, TLS, startup,
/// authentication).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// An open connection: the client half, and the notifications (`NOTIFY`)
/// the server sent on it. The connection itself is driven by a spawned task
/// that ends when the connection closes.
pub(crate) struct Connected {
    pub(crate) client: tokio_postgres::Client,
    pub(crate) notifications: mpsc::UnboundedReceiver<Notification>,
}

type ConnectFuture = Pin<Box<dyn Future<Output = Result<Connected, tokio_postgres::Error>> + Send>>;
type ConnectFn = dyn Fn() -> ConnectFuture + Send + Sync;

/// Opens new connections to one database: a connection config plus a TLS
/// setting. Cheap to clone.
///
/// ```no_run
/// # fn example() -> Result<(), pg_lease_client::Error> {
/// use pg_lease_client::Connector;
///
/// let connector = Connector::no_tls("host=127.0.0.1 user=app dbname=app")?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Connector {
    connect: Arc<ConnectFn>,
    connect_timeout: Duration,
    prepare: bool,
    shown: Arc<str>,
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector")
            .field("target", &self.shown)
            .field("connect_timeout", &self.connect_timeout)
            .field("prepare", &self.prepare)
            .finish()
    }
}

impl Connector {
    /// A connector for `config` using `tls` (for example
    /// `tokio_postgres::NoTls`, or a `postgres-native-tls`/`postgres-openssl`
    /// connector).
    pub fn new<T>(config: tokio_postgres::Config, tls: T) -> Connector
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::Stream: Send + 'static,
        T::TlsConnect: Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        let shown = show_target(&config);
        let config = Arc::new(config);
        let connect = move || -> ConnectFuture {
            let config = Arc::clone(&config);
            let tls = tls.clone();
            Box::pin(async move {
                let (client, mut connection) = config.connect(tls).await?;
                let (tx, notifications) = mpsc::unbounded_channel();
                tokio::spawn(async move {
                    // Drives the connection; ends when it closes or fails,
                    // which the client half then reports as `is_closed`.
                    while let Some(message) = poll_fn(|cx| connection.poll_message(cx)).await {
                        match message {
                            Ok(AsyncMessage::Notification(n)) => {
                                // Nobody listening on this connection: drop it.
                                let _ = tx.send(n);
                            }
                            Ok(_) => {}
                            Err(_) => break,
                        }
                    }
                });
                Ok(Connected {
                    client,
                    notifications,
                })
            })
        };
        Connector {
            connect: Arc::new(connect),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            prepare: true,
            shown: shown.into(),
        }
    }

    /// A connector without TLS for a libpq-style connection string
    /// (`host=... user=... dbname=...`) or URL (`postgresql://...`).
    /// A string that does not parse is [`Error::InvalidInput`].
    pub fn no_tls(conn: &str) -> Result<Connector> {
        let config: tokio_postgres::Config = conn
            .parse()
            .map_err(|e| Error::invalid(format!("bad connection string: {e}")))?;
        Ok(Connector::new(config, tokio_postgres::NoTls))
    }

    /// The same connector, tagging every connection it opens with
    /// `application_name` (seen in `pg_stat_activity` and the server log).
    /// A session setting, so not for connections through a transaction-mode
    /// pooler, which would hand it to other clients' transactions.
    pub fn with_application_name(&self, name: &str) -> Connector {
        let open = Arc::clone(&self.connect);
        let name: Arc<str> = name.into();
        let connect = move || -> ConnectFuture {
            let open = Arc::clone(&open);
            let name = Arc::clone(&name);
            Box::pin(async move {
                let connected = open().await?;
                connected
                    .client
                    .query_typed(
                        "SELECT pg_catalog.set_config('application_name', $1, false)",
                        &[(&&*name, Type::TEXT)],
                    )
                    .await?;
                Ok(connected)
            })
        };
        Connector {
            connect: Arc::new(connect),
            connect_timeout: self.connect_timeout,
            prepare: self.prepare,
            shown: Arc::clone(&self.shown),
        }
    }

    /// Sets the time allowed for opening a connection (default
    /// [`DEFAULT_CONNECT_TIMEOUT`]).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Connector {
        self.connect_timeout = timeout;
        self
    }

    /// The time allowed for opening a connection.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// Whether [`Client`](crate::Client)s over this connector prepare their
    /// statements (the default, `true`): each statement is prepared once
    /// per connection, and a call is then one round trip that the server
    /// need not parse or plan again. With `false`, each call is sent
    /// unnamed with its parameter types, still in one round trip, and no
    /// statement outlives it: for a transaction-mode pooler that cannot
    /// keep prepared statements (PgBouncer before 1.21, or without
    /// `max_prepared_statements`), which hands each transaction to any
    /// server connection.
    pub fn with_prepared_statements(mut self, prepare: bool) -> Connector {
        self.prepare = prepare;
        self
    }

    /// Whether clients over this connector prepare their statements.
    pub fn prepared_statements(&self) -> bool {
        self.prepare
    }

    /// Opens a connection within the connect timeout.
    pub(crate) async fn open(&self) -> Result<Connected> {
        match tokio::time::timeout(self.connect_timeout, (self.connect)()).await {
            Ok(Ok(connected)) => Ok(connected),
            Ok(Err(e)) => Err(Error::from_pg(e)),
            Err(_) => Err(Error::Timeout(self.connect_timeout)),
        }
    }
}

/// `host:port,host:port/dbname` for Debug output; never the password.
fn show_target(config: &tokio_postgres::Config) -> String {
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let host = match h {
                tokio_postgres::config::Host::Tcp(name) => name.clone(),
                tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
            };
            // One port for all hosts, or one per host (libpq's rule).
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            format!("{host}:{port}")
        })
        .collect();
    let db = config.get_dbname().unwrap_or_default();
    format!("{}/{db}", hosts.join(","))
}
