//! Test harness for pg_lease: throwaway PostgreSQL clusters of the version
//! under test (see [`pg_bin_dir`]).
//!
//! Each [`Cluster`] is a real, private PostgreSQL server: its own data
//! directory under the system temp dir, its own TCP port on 127.0.0.1 and its
//! own Unix socket directory. Tests therefore never share server state, can run
//! in parallel, and can restart or break a server without affecting others.
//! Dropping the [`Cluster`] stops the server and deletes the data directory.
//!
//! The modules hold what several test files share; CONTRIBUTING.md ("Writing
//! a test in pg_tests/") says how a test is laid out and why the
//! duplicates tool's shape pairs between test bodies are left as they are.
//!
//! PostgreSQL refuses to run as root, so when the test process is root the
//! server tools are run as the OS user `postgres` through `runuser`.
//!
//! ```no_run
//! # async fn example() {
//! use pg_tests::{Cluster, ClusterConfig};
//!
//! let cluster = Cluster::start_with(ClusterConfig {
//!     extra_conf: vec!["shared_preload_libraries = 'pg_lease'".into()],
//!     ..Default::default()
//! });
//! let client = cluster.connect().await;
//! let row = client.query_one("SELECT 1", &[]).await.expect("SELECT 1");
//! assert_eq!(row.get::<_, i32>(0), 1);
//! # }
//! ```

#![warn(missing_docs)]

pub mod catalog;
pub mod child;
pub mod citus;
pub mod claims;
pub mod jobs;
pub mod pgbouncer;
pub mod proxy;
mod rng;
pub mod service_instances;
pub mod sql_install;
pub mod workers;

pub use rng::Rng;

use std::env;
use std::fs;
use std::io::ErrorKind;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

/// Environment variable naming the directory with `initdb`, `pg_ctl`,
/// `postgres` and `psql` of the PostgreSQL version under test.
pub const PG_BIN_ENV: &str = "PG_LEASE_PG_BIN";

/// Environment variable naming the `pg_config` of the version under test,
/// used when [`PG_BIN_ENV`] is not set (`pg_config` on the PATH otherwise).
pub const PG_CONFIG_ENV: &str = "PG_CONFIG";

/// Database superuser created by `initdb -U`; every connection defaults to it
/// so tests can do anything (create roles, extensions, databases).
pub const SUPERUSER: &str = "postgres";

/// OS account the server runs as when the test process is root, because
/// PostgreSQL refuses to run as root.
pub const POSTGRES_OS_USER: &str = "postgres";

/// Database created in every cluster, so tests do not clutter the `postgres`
/// maintenance database; [`Cluster::connect`] connects to it.
pub const TEST_DB: &str = "pg_lease_test";

/// Set to `citus` to run them against a distributed install
/// ([`citus_install_mode`]), or to `sql` to run the tests against the install without the library
/// (`bin/sql-install`): [`Cluster::start`] then has [`SQL_OWNER`], a role
/// that is no superuser, own [`TEST_DB`] and install pg_lease there, tests
/// connect as that role, and [`ClusterConfig::with_reaper`] runs a sweeper
/// of the harness's instead of preloading the library.
pub const INSTALL_ENV: &str = "PG_LEASE_INSTALL";

/// The owner of [`TEST_DB`] who installs pg_lease without the library.
pub const SQL_OWNER: &str = "lease_owner";

/// Whether [`INSTALL_ENV`] asks for the install without the library.
pub fn sql_install_mode() -> bool {
    env::var(INSTALL_ENV).is_ok_and(|v| v == "sql")
}

/// Whether [`INSTALL_ENV`] asks for a distributed install (`citus`):
/// [`Cluster::start_with`] then starts a Citus coordinator and two worker
/// nodes, runs `lease.distribute()`, and returns the coordinator, which
/// keeps the worker nodes running until it is dropped.
pub fn citus_install_mode() -> bool {
    env::var(INSTALL_ENV).is_ok_and(|v| v == "citus")
}

/// Whether this test runs on a distributed install, where `what` cannot be
/// tested (said on stderr, so the run shows what it skipped).
pub fn skipped_on_citus(what: &str) -> bool {
    let citus = citus_install_mode();
    if citus {
        eprintln!("SKIPPED on a distributed install: {what}");
    }
    citus
}

/// The role tests connect as: the superuser, or [`SQL_OWNER`] in SQL mode.
pub fn test_user() -> &'static str {
    if sql_install_mode() {
        SQL_OWNER
    } else {
        SUPERUSER
    }
}

/// Name of the extension under test, created when
/// [`ClusterConfig::create_extension`] is true.
pub const EXTENSION: &str = "pg_lease";

/// How many ports to try before giving up: another process can grab the port
/// between picking it and the server binding it.
const START_ATTEMPTS: u32 = 5;

/// Seconds `pg_ctl` waits for start or stop; generous because a loaded
/// 2-core CI machine running tests in parallel can be slow.
const PG_CTL_TIMEOUT_SECS: &str = "60";

/// Lines of `server.log` quoted in error messages.
const LOG_TAIL_LINES: usize = 40;

/// Libpq environment variables that would override or disturb the explicit
/// connection settings the harness passes to `psql` and `pg_ctl`.
const PG_ENV_VARS: &[&str] = &[
    "PGDATA",
    "PGHOST",
    "PGHOSTADDR",
    "PGPORT",
    "PGUSER",
    "PGDATABASE",
    "PGPASSWORD",
    "PGPASSFILE",
    "PGSERVICE",
    "PGSERVICEFILE",
    "PGOPTIONS",
    "PGSSLMODE",
    "PGCONNECT_TIMEOUT",
    "PGTZ",
    "PGCLIENTENCODING",
];

/// Options for [`Cluster::start_with`].
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// Lines appended to `postgresql.conf` after the harness's own settings
    /// (so they win), e.g. `shared_preload_libraries = 'pg_lease'`. Do not
    /// set `port`, `listen_addresses` or `unix_socket_directories` here: the
    /// harness chooses and reports those.
    pub extra_conf: Vec<String>,
    /// Run `CREATE EXTENSION pg_lease` in [`TEST_DB`] after start; true by
    /// default because almost every test needs it. Turn it off to test the
    /// harness itself or installation paths.
    pub create_extension: bool,
    /// In SQL mode ([`INSTALL_ENV`]), `lease.sweep()` every this long from
    /// a thread of the harness, standing in for the background reaper.
    pub sweep_every: Option<Duration>,
}

impl ClusterConfig {
    /// The background reaper preloaded and sweeping every `sweep_interval`
    /// (the tests use 100 ms or so), and the extension created.
    pub fn with_reaper(sweep_interval: Duration) -> ClusterConfig {
        if sql_install_mode() {
            return ClusterConfig {
                sweep_every: Some(sweep_interval),
                ..ClusterConfig::default()
            };
        }
        ClusterConfig {
            extra_conf: reaper_conf(sweep_interval),
            ..ClusterConfig::default()
        }
    }
}

/// The settings of [`ClusterConfig::with_reaper`], for a configuration
/// that needs more lines, or a standby's.
pub fn reaper_conf(sweep_interval: Duration) -> Vec<String> {
    vec![
        "shared_preload_libraries = 'pg_lease'".into(),
        format!("lease.sweep_interval = '{}ms'", sweep_interval.as_millis()),
    ]
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            extra_conf: Vec::new(),
            create_extension: true,
            sweep_every: None,
        }
    }
}

/// A running throwaway PostgreSQL cluster, stopped and deleted on drop.
///
/// Start it with [`Cluster::start`] or [`Cluster::start_with`]; both panic
/// with the relevant tool output or server log on failure, since this is test
/// code and a failed start should stop the test with a clear reason.
#[derive(Debug)]
pub struct Cluster {
    data_dir: PathBuf,
    port: u16,
    bin_dir: PathBuf,
    run_as: RunAs,
    /// The harness's sweeper in SQL mode: its stop flag and thread.
    sweeper: Option<(Arc<AtomicBool>, thread::JoinHandle<()>)>,
    /// A distributed install's worker nodes, stopped after this coordinator.
    nodes: Vec<Cluster>,
}

impl Cluster {
    /// Starts a cluster with [`ClusterConfig::default`]: no extra settings,
    /// extension created. Panics with a clear message on failure.
    pub fn start() -> Cluster {
        Cluster::start_with(ClusterConfig::default())
    }

    /// Initializes, configures and starts a fresh cluster, creates
    /// [`TEST_DB`] and, if asked, the extension. Panics with a clear message
    /// (including tool output or the server log) on failure; anything already
    /// created is cleaned up first.
    pub fn start_with(config: ClusterConfig) -> Cluster {
        if citus_install_mode() && config.create_extension {
            return citus::distributed_install(&config);
        }
        match Cluster::try_start(&config) {
            Ok(cluster) => cluster,
            Err(err) => panic!("pg_tests: could not start a PostgreSQL test cluster: {err}"),
        }
    }

    /// TCP port the server listens on (on 127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Data directory of the cluster; also its Unix socket directory and the
    /// home of `server.log`.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Libpq/tokio-postgres connection string for database `db` as the
    /// superuser, e.g. `host=127.0.0.1 port=N user=postgres dbname=db`.
    pub fn conn_string(&self, db: &str) -> String {
        self.conn_string_as(db, test_user())
    }

    /// Connects to [`TEST_DB`] as the superuser ([`SQL_OWNER`] in SQL
    /// mode); see [`Cluster::connect_to`].
    pub async fn connect(&self) -> tokio_postgres::Client {
        self.connect_to(TEST_DB, test_user()).await
    }

    /// Connects to database `db` as role `user` (trust auth, no password).
    ///
    /// The connection future is spawned with `tokio::spawn`, so this must be
    /// called inside a tokio runtime; the connection lives until the client is
    /// dropped. Panics with a clear message if the connection fails.
    pub async fn connect_to(&self, db: &str, user: &str) -> tokio_postgres::Client {
        let conn_str = self.conn_string_as(db, user);
        let (client, connection) =
            match tokio_postgres::connect(&conn_str, tokio_postgres::NoTls).await {
                Ok(pair) => pair,
                Err(err) => panic!(
                    "pg_tests: could not connect with \"{conn_str}\": {}\n\
                 --- server.log (last {LOG_TAIL_LINES} lines) ---\n{}",
                    error_chain(&err),
                    tail(&self.server_log(), LOG_TAIL_LINES)
                ),
            };
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                eprintln!(
                    "pg_tests: connection \"{conn_str}\" ended with an error: {}",
                    error_chain(&err)
                );
            }
        });
        client
    }

    /// A connection to `db` as `user` that hands its notifications, as
    /// (channel, payload), to the receiver returned beside it.
    pub async fn listener(
        &self,
        db: &str,
        user: &str,
    ) -> (
        tokio_postgres::Client,
        tokio::sync::mpsc::UnboundedReceiver<(String, String)>,
    ) {
        let conn_str = self.conn_string_as(db, user);
        let (client, mut connection) =
            match tokio_postgres::connect(&conn_str, tokio_postgres::NoTls).await {
                Ok(pair) => pair,
                Err(err) => panic!(
                    "pg_tests: could not connect with \"{conn_str}\": {}",
                    error_chain(&err)
                ),
            };
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(Ok(message)) =
                std::future::poll_fn(|cx| connection.poll_message(cx)).await
            {
                if let tokio_postgres::AsyncMessage::Notification(n) = message {
                    let _ = tx.send((n.channel().to_owned(), n.payload().to_owned()));
                }
            }
        });
        (client, rx)
    }

    /// The worker nodes of a distributed install ([`citus_install_mode`]);
    /// none on a single node.
    pub fn nodes(&self) -> &[Cluster] {
        &self.nodes
    }

    /// One `lease.sweep()` on this server and on every worker node (on a
    /// distributed install each node sweeps the queues it holds).
    pub async fn sweep(&self) {
        for node in std::iter::once(self).chain(self.nodes()) {
            node.connect()
                .await
                .batch_execute("SELECT lease.sweep()")
                .await
                .expect("sweep");
        }
    }

    /// Contents of the server's `server.log`, for assertions on logged
    /// messages and for debugging; a placeholder text if it cannot be read.
    pub fn server_log(&self) -> String {
        let path = self.log_path();
        match fs::read(&path) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(err) => format!("<could not read {}: {err}>", path.display()),
        }
    }

    /// Runs `sql` in database `db` with `psql` (as the superuser, stopping at
    /// the first error) and returns its unaligned, tuples-only output.
    ///
    /// Synchronous, for setup steps outside a tokio runtime; panics with
    /// psql's stderr on failure.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        match self.try_psql(db, sql) {
            Ok(out) => out,
            Err(err) => panic!("pg_tests: psql failed: {err}"),
        }
    }

    /// Restarts the server as `pg_ctl restart -m immediate` does: no
    /// shutdown checkpoint, every client cut off, crash recovery from the WAL
    /// on the way up. Port and data directory stay, so connection strings
    /// stay valid; the log is appended to. Blocks until the server accepts
    /// connections again; panics with a clear message on failure.
    pub fn restart_immediate(&self) {
        if let Err(err) = self.restart("immediate", None) {
            panic!(
                "pg_tests: could not restart the server on port {}: {err}",
                self.port
            );
        }
    }

    /// Restarts the server (fast shutdown) with `program` started in place
    /// of the `postgres` binary (`pg_ctl -p`), e.g. a script that runs
    /// postgres under valgrind; it gets postgres's arguments and must exec
    /// it. Port and data directory stay. Blocks until the server accepts
    /// connections.
    pub fn restart_under(&self, program: &Path) -> Result<(), String> {
        self.restart("fast", Some(program))
    }

    /// `pg_ctl restart` with shutdown `mode`, and `program` in place of the
    /// postgres binary if given; waits until the server is up.
    fn restart(&self, mode: &str, program: Option<&Path>) -> Result<(), String> {
        let mut cmd = self.pg_command("pg_ctl");
        cmd.arg("-D")
            .arg(&self.data_dir)
            .arg("-l")
            .arg(self.log_path());
        if let Some(program) = program {
            cmd.arg("-p").arg(program);
        }
        cmd.args(["-m", mode, "-w", "-t", PG_CTL_TIMEOUT_SECS])
            .arg("restart");
        run(&mut cmd, "pg_ctl restart").map(drop)
    }

    /// Starts a streaming standby of `primary`: a `pg_basebackup -R` copy
    /// (so it has [`TEST_DB`] and the extension) in its own data directory,
    /// on its own port, with `config.extra_conf` appended to its
    /// configuration and, in SQL mode, the harness's sweeper if
    /// `config.sweep_every` asks (its sweeps fail until a promotion, as a
    /// standby's reaper waits for one).
    ///
    /// Replication is asynchronous unless the primary names the standby in
    /// `synchronous_standby_names`. Panics with a clear message on failure.
    pub fn start_standby(primary: &Cluster, config: &ClusterConfig) -> Cluster {
        match Cluster::try_start_standby(primary, &config.extra_conf) {
            Ok(mut standby) => {
                if let (true, Some(every)) = (sql_install_mode(), config.sweep_every) {
                    standby.sweeper = Some(spawn_sweeper(standby.conn_string(TEST_DB), every));
                }
                standby
            }
            Err(err) => panic!("pg_tests: could not start a standby: {err}"),
        }
    }

    /// Stops the server the way a crash would (`pg_ctl stop -m immediate`:
    /// no shutdown checkpoint, clients cut off). The data directory stays,
    /// so the cluster can still be inspected; drop removes it as usual.
    pub fn crash(&self) {
        if let Err(err) = self.stop_server() {
            panic!(
                "pg_tests: could not crash the server on port {}: {err}",
                self.port
            );
        }
    }

    /// Promotes a standby to primary (`pg_ctl promote`, waiting until it
    /// accepts writes). The WAL timeline increases by one.
    pub fn promote(&self) {
        let mut cmd = self.pg_command("pg_ctl");
        cmd.arg("-D")
            .arg(&self.data_dir)
            .args(["-w", "-t", PG_CTL_TIMEOUT_SECS, "promote"]);
        if let Err(err) = run(&mut cmd, "pg_ctl promote") {
            panic!(
                "pg_tests: could not promote the standby on port {}: {err}",
                self.port
            );
        }
    }

    fn try_start_standby(primary: &Cluster, extra_conf: &[String]) -> Result<Cluster, String> {
        let data_dir = create_unique_dir()?;
        let mut standby = Cluster {
            data_dir,
            port: 0,
            bin_dir: primary.bin_dir.clone(),
            run_as: primary.run_as,
            sweeper: None,
            nodes: Vec::new(),
        };
        standby.chown_data_dir()?;
        // -R writes primary_conninfo and standby.signal; -c fast skips the
        // wait for a spread checkpoint on the primary.
        let mut cmd = standby.pg_command("pg_basebackup");
        cmd.arg("-D")
            .arg(&standby.data_dir)
            .args(["-h", "127.0.0.1", "-p", &primary.port.to_string()])
            .args([
                "-U",
                SUPERUSER,
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
            ]);
        run(&mut cmd, "pg_basebackup")?;
        // The copied postgresql.conf ends with the primary's harness block;
        // start_server appends the standby's own, which wins.
        standby.start_server(extra_conf)?;
        Ok(standby)
    }

    fn chown_data_dir(&self) -> Result<(), String> {
        if let RunAs::PostgresUser { uid, gid } = self.run_as {
            std::os::unix::fs::chown(&self.data_dir, Some(uid), Some(gid)).map_err(|err| {
                format!(
                    "could not chown {} to {POSTGRES_OS_USER}: {err}",
                    self.data_dir.display()
                )
            })?;
        }
        Ok(())
    }

    fn try_start(config: &ClusterConfig) -> Result<Cluster, String> {
        // SQL mode stands for a server without the library: never load it.
        if sql_install_mode()
            && config
                .extra_conf
                .iter()
                .any(|line| line.contains("shared_preload_libraries") && line.contains(EXTENSION))
        {
            return Err(format!(
                "{INSTALL_ENV}=sql tests a server without the library, but the \
                 configuration preloads it; use ClusterConfig::with_reaper"
            ));
        }
        let run_as = run_as()?;
        let bin_dir = pg_bin_dir();
        for tool in ["initdb", "pg_ctl", "postgres", "psql"] {
            if !bin_dir.join(tool).is_file() {
                return Err(format!(
                    "{} not found; install PostgreSQL or set {PG_BIN_ENV} \
                     to the directory holding its binaries",
                    bin_dir.join(tool).display()
                ));
            }
        }
        let data_dir = create_unique_dir()?;
        // From here on, dropping `cluster` (on error or panic) stops whatever
        // was started and removes the directory.
        let mut cluster = Cluster {
            data_dir,
            port: 0,
            bin_dir,
            run_as,
            sweeper: None,
            nodes: Vec::new(),
        };
        cluster.chown_data_dir()?;
        cluster.initdb()?;
        cluster.start_server(&config.extra_conf)?;
        cluster
            .try_psql("postgres", &format!("CREATE DATABASE {TEST_DB}"))
            .map_err(|err| format!("could not create database {TEST_DB}: {err}"))?;
        if config.create_extension && sql_install_mode() {
            cluster.install_without_library()?;
            if let Some(every) = config.sweep_every {
                cluster.sweeper = Some(spawn_sweeper(cluster.conn_string(TEST_DB), every));
            }
        } else if config.create_extension {
            cluster
                .try_psql(TEST_DB, &format!("CREATE EXTENSION {EXTENSION}"))
                .map_err(|err| {
                    format!(
                        "CREATE EXTENSION {EXTENSION} failed (is the extension installed \
                         into this PostgreSQL, e.g. with `cargo pgrx install`?): {err}"
                    )
                })?;
        }
        Ok(cluster)
    }

    /// SQL mode: [`SQL_OWNER`] owns [`TEST_DB`] and installs pg_lease there
    /// with `bin/sql-install`'s script, the roles created first as an
    /// operator would.
    fn install_without_library(&self) -> Result<(), String> {
        self.try_psql(
            TEST_DB,
            &format!(
                "SET pg_tests.owner = '{SQL_OWNER}'; {}",
                sql_install::OPERATOR_SQL
            ),
        )?;
        self.try_psql(
            TEST_DB,
            &format!("ALTER DATABASE {TEST_DB} OWNER TO {SQL_OWNER}"),
        )?;
        sql_install::psql_as(self, SQL_OWNER, TEST_DB, &sql_install::script());
        Ok(())
    }

    fn initdb(&self) -> Result<(), String> {
        let mut cmd = self.pg_command("initdb");
        cmd.arg("-D")
            .arg(&self.data_dir)
            .args(["-U", SUPERUSER, "--auth=trust", "--no-sync", "-E", "UTF8"])
            .arg("--locale=C");
        run(&mut cmd, "initdb").map(drop)
    }

    /// Writes the configuration and starts the server, picking a new port and
    /// retrying when the chosen one turned out to be taken.
    fn start_server(&mut self, extra_conf: &[String]) -> Result<(), String> {
        let conf_path = self.data_dir.join("postgresql.conf");
        // Keep initdb's file and rewrite only our block on each attempt, so a
        // retry does not pile up conflicting `port` lines.
        let base_conf = fs::read_to_string(&conf_path)
            .map_err(|err| format!("could not read {}: {err}", conf_path.display()))?;
        let mut last_err = String::new();
        for attempt in 1..=START_ATTEMPTS {
            self.port = free_port()?;
            let conf = format!(
                "{base_conf}\n# --- added by the pg_tests harness ---\n{}",
                self.harness_conf(extra_conf)
            );
            fs::write(&conf_path, conf)
                .map_err(|err| format!("could not write {}: {err}", conf_path.display()))?;
            // A fresh log per attempt, so errors quote only this attempt.
            let _ = fs::remove_file(self.log_path());

            let mut cmd = self.pg_command("pg_ctl");
            cmd.arg("-D")
                .arg(&self.data_dir)
                .arg("-l")
                .arg(self.log_path())
                .args(["-w", "-t", PG_CTL_TIMEOUT_SECS, "start"]);
            let err = match run(&mut cmd, "pg_ctl start") {
                Ok(_) => return Ok(()),
                Err(err) => err,
            };
            let log = self.server_log();
            // pg_ctl may have timed out while the server was still coming up.
            if let Err(stop_err) = self.stop_server() {
                eprintln!("pg_tests: cleanup after failed start: {stop_err}");
            }
            last_err = format!(
                "{err}\n--- server.log (last {LOG_TAIL_LINES} lines) ---\n{}",
                tail(&log, LOG_TAIL_LINES)
            );
            if !is_port_conflict(&log) || attempt == START_ATTEMPTS {
                break;
            }
            eprintln!(
                "pg_tests: port {} was taken (attempt {attempt} of {START_ATTEMPTS}), retrying",
                self.port
            );
        }
        Err(last_err)
    }

    fn harness_conf(&self, extra_conf: &[String]) -> String {
        let mut conf = format!(
            "listen_addresses = '127.0.0.1'\n\
             port = {}\n\
             unix_socket_directories = '{}'\n\
             fsync = off\n\
             max_connections = 100\n",
            self.port,
            self.data_dir.display().to_string().replace('\'', "''"),
        );
        for line in extra_conf {
            conf.push_str(line);
            conf.push('\n');
        }
        conf
    }

    /// Stops the server if its pid file says it may be running.
    fn stop_server(&self) -> Result<(), String> {
        if !self.data_dir.join("postmaster.pid").exists() {
            return Ok(());
        }
        let mut cmd = self.pg_command("pg_ctl");
        cmd.arg("-D").arg(&self.data_dir).args([
            "-m",
            "immediate",
            "-w",
            "-t",
            PG_CTL_TIMEOUT_SECS,
            "stop",
        ]);
        run(&mut cmd, "pg_ctl stop").map(drop)
    }

    /// Last resort when `pg_ctl stop` failed: SIGQUIT (immediate shutdown) to
    /// the postmaster named in the pid file, if that pid is still a postgres
    /// process, then wait briefly for it to go away.
    fn kill_postmaster(&self) {
        let Ok(pid_file) = fs::read_to_string(self.data_dir.join("postmaster.pid")) else {
            return;
        };
        let Some(pid) = pid_file
            .lines()
            .next()
            .and_then(|line| line.trim().parse::<u32>().ok())
        else {
            return;
        };
        let is_postgres = fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|comm| comm.trim() == "postgres")
            .unwrap_or(false);
        if !is_postgres || !process_alive(pid) {
            return;
        }
        let status = Command::new("kill")
            .args(["-QUIT", &pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if !matches!(status, Ok(s) if s.success()) {
            eprintln!("pg_tests: could not signal postmaster {pid}");
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while process_alive(pid) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Copies database `from` into a new database `to` the way operators
    /// move a database: `pg_dump -Fc`, `createdb`, `pg_restore`, each as the
    /// superuser. Panics with the tool's output on failure.
    pub fn dump_and_restore(&self, from: &str, to: &str) {
        let archive = self.data_dir.join(format!("{from}.dump"));
        let port = self.port.to_string();
        let conn = ["-h", "127.0.0.1", "-p", &port, "-U", SUPERUSER];
        let steps: [(&str, Vec<&str>); 3] = [
            ("pg_dump", vec!["-Fc", "-d", from, "-f"]),
            ("createdb", vec![to]),
            ("pg_restore", vec!["--exit-on-error", "-d", to]),
        ];
        for (program, args) in steps {
            let mut cmd = self.pg_command(program);
            cmd.args(conn).args(args);
            if program != "createdb" {
                cmd.arg(&archive);
            }
            if let Err(err) = run(&mut cmd, program) {
                panic!("pg_tests: {program} failed: {err}");
            }
        }
    }

    fn try_psql(&self, db: &str, sql: &str) -> Result<String, String> {
        let mut cmd = self.pg_command("psql");
        cmd.args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", SUPERUSER, "-d", db])
            .args(["-v", "ON_ERROR_STOP=1", "-X", "-q", "-A", "-t", "-c", sql]);
        let out = run(&mut cmd, "psql")?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// libpq connection string for database `db` as role `user`, for tests
    /// that need the connection itself (its notifications).
    pub fn conn_string_as(&self, db: &str, user: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user={} dbname={}",
            self.port,
            conn_value(user),
            conn_value(db)
        )
    }

    fn log_path(&self) -> PathBuf {
        self.data_dir.join("server.log")
    }

    /// A command for PostgreSQL tool `program`, run as the right OS user with
    /// a clean libpq environment.
    fn pg_command(&self, program: &str) -> Command {
        let exe = self.bin_dir.join(program);
        let mut cmd = match self.run_as {
            RunAs::CurrentUser => Command::new(exe),
            RunAs::PostgresUser { .. } => {
                let mut cmd = Command::new("runuser");
                cmd.args(["-u", POSTGRES_OS_USER, "--"]).arg(exe);
                cmd
            }
        };
        // The caller's cwd (e.g. under /root) may be unreadable for the
        // postgres user; the temp dir is not.
        cmd.current_dir(env::temp_dir()).stdin(Stdio::null());
        for var in PG_ENV_VARS {
            cmd.env_remove(var);
        }
        cmd
    }
}

impl Drop for Cluster {
    /// Stops the server (immediate mode: the data is thrown away anyway) and
    /// deletes the data directory. Never panics; problems go to stderr.
    fn drop(&mut self) {
        if let Some((stop, thread)) = self.sweeper.take() {
            stop.store(true, Ordering::Relaxed);
            let _ = thread.join();
        }
        if thread::panicking() {
            eprintln!(
                "pg_tests: test panicked; server.log of cluster on port {} (last {LOG_TAIL_LINES} lines):\n{}",
                self.port,
                tail(&self.server_log(), LOG_TAIL_LINES)
            );
        }
        if let Err(err) = self.stop_server() {
            eprintln!("pg_tests: {err}");
            self.kill_postmaster();
        }
        if let Err(err) = fs::remove_dir_all(&self.data_dir) {
            if err.kind() != ErrorKind::NotFound {
                eprintln!(
                    "pg_tests: could not remove {}: {err}",
                    self.data_dir.display()
                );
            }
        }
    }
}

/// Runs `sql` (no parameters) and returns the first column of its one row;
/// panics with the statement and the error otherwise. For tests.
pub async fn scalar<T>(client: &tokio_postgres::Client, sql: &str) -> T
where
    T: for<'a> tokio_postgres::types::FromSql<'a>,
{
    match client.query_one(sql, &[]).await {
        Ok(row) => row.get(0),
        Err(err) => panic!("{sql}: {}", error_chain(&err)),
    }
}

/// The database an example runs against: its first argument, else
/// `PG_LEASE_URL`, else a throwaway PostgreSQL started here (kept alive by
/// the returned cluster, dropped with it).
pub fn example_database() -> (Option<Cluster>, String) {
    let given = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("PG_LEASE_URL").ok());
    match given {
        Some(url) => (None, url),
        None => {
            println!("Starting a throwaway PostgreSQL ...");
            let cluster = Cluster::start();
            let url = cluster.conn_string(TEST_DB);
            (Some(cluster), url)
        }
    }
}

/// Polls `sql` (one boolean) every 20 ms until it is true and returns how
/// long that took; panics naming `sql` after `within`. For tests.
pub async fn eventually(client: &tokio_postgres::Client, sql: &str, within: Duration) -> Duration {
    until(sql, within, || scalar::<bool>(client, sql)).await
}

/// Polls `check` every 20 ms until it holds and returns how long that
/// took; panics naming `what` after `within`. For tests.
pub async fn until<F, Fut>(what: &str, within: Duration, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(
            start.elapsed() < within,
            "not true within {within:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

/// The SQLSTATE of a failed statement, if the server sent one.
pub fn sqlstate(err: &tokio_postgres::Error) -> Option<String> {
    err.as_db_error().map(|d| d.code().code().to_owned())
}

/// Directory with the server binaries of the version under test:
/// [`PG_BIN_ENV`] if set and non-empty, else what `pg_config --bindir` says
/// ([`PG_CONFIG_ENV`], or `pg_config` on the PATH). Found once per process.
pub fn pg_bin_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(dir) = env::var_os(PG_BIN_ENV).filter(|d| !d.is_empty()) {
            return PathBuf::from(dir);
        }
        let pg_config = env::var_os(PG_CONFIG_ENV)
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "pg_config".into());
        match Command::new(&pg_config).arg("--bindir").output() {
            Ok(out) if out.status.success() => {
                PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
            }
            _ => panic!(
                "pg_tests: no PostgreSQL found: set {PG_BIN_ENV} to its bin directory, \
                 or {PG_CONFIG_ENV} to its pg_config, or put pg_config on the PATH"
            ),
        }
    })
    .clone()
}

/// Major version of the server binaries under test (`postgres --version`).
pub fn server_major() -> u32 {
    let out = Command::new(pg_bin_dir().join("postgres"))
        .arg("--version")
        .output()
        .expect("postgres --version");
    // "postgres (PostgreSQL) 18.6"
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .last()
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse().ok())
        .expect("a version number from postgres --version")
}

/// Which OS user runs the PostgreSQL tools.
#[derive(Clone, Copy, Debug)]
enum RunAs {
    /// Not root: run them directly.
    CurrentUser,
    /// Root: run them as [`POSTGRES_OS_USER`], who must own the data dir.
    PostgresUser { uid: u32, gid: u32 },
}

/// Detects (once per process) whether tools must run as the postgres user.
fn run_as() -> Result<RunAs, String> {
    static RUN_AS: OnceLock<Result<RunAs, String>> = OnceLock::new();
    RUN_AS
        .get_or_init(|| {
            if effective_uid()? != 0 {
                return Ok(RunAs::CurrentUser);
            }
            Ok(RunAs::PostgresUser {
                uid: id_number(&["-u", POSTGRES_OS_USER])?,
                gid: id_number(&["-g", POSTGRES_OS_USER])?,
            })
        })
        .clone()
}

/// Effective uid of this process, from `/proc/self/status` (no libc here),
/// falling back to `id -u`.
fn effective_uid() -> Result<u32, String> {
    let from_proc = fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("Uid:"))
                // Fields: real, effective, saved, filesystem.
                .and_then(|ids| ids.split_whitespace().nth(1))
                .and_then(|uid| uid.parse().ok())
        });
    match from_proc {
        Some(uid) => Ok(uid),
        None => id_number(&["-u"]),
    }
}

/// Runs `id` with `args` and parses the number it prints.
fn id_number(args: &[&str]) -> Result<u32, String> {
    let out = run(Command::new("id").args(args), "id")?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .parse()
        .map_err(|err| format!("`id {}` printed {text:?}: {err}", args.join(" ")))
}

/// Creates a new, empty, private directory `pg_lease_test_<pid>_<n>` under the
/// temp dir; the counter keeps clusters of one process apart, the pid keeps
/// processes apart.
fn create_unique_dir() -> Result<PathBuf, String> {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let pid = std::process::id();
    for _ in 0..1000 {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = env::temp_dir().join(format!("pg_lease_test_{pid}_{n}"));
        // initdb insists on 0700 (or 0750) for the data directory.
        match fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            // Left over from an earlier process with the same pid.
            Err(err) if err.kind() == ErrorKind::AlreadyExists => continue,
            Err(err) => return Err(format!("could not create {}: {err}", dir.display())),
        }
    }
    Err(format!(
        "could not find an unused pg_lease_test_{pid}_* name in {}",
        env::temp_dir().display()
    ))
}

/// A TCP port on 127.0.0.1 that was free a moment ago. Another process may
/// take it before the server binds it, hence the retries in `start_server`.
fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|err| format!("could not bind a probe socket on 127.0.0.1: {err}"))?;
    let port = listener
        .local_addr()
        .map_err(|err| format!("could not read the probe socket's port: {err}"))?
        .port();
    drop(listener);
    Ok(port)
}

/// Whether process `pid` exists and has not exited. An exited process whose
/// parent has not reaped it yet (a zombie, state `Z`) counts as gone: the
/// postmaster is daemonized, so its parent is PID 1, which in some containers
/// reaps orphans only after a delay.
pub fn process_alive(pid: u32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // Format: `pid (comm) state ...`; comm may contain spaces or parentheses.
    match stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next())
    {
        Some(state) => !matches!(state, "Z" | "X" | "x"),
        None => false,
    }
}

/// Whether a failed start was caused by the port being taken, which is worth
/// retrying on another port.
fn is_port_conflict(log: &str) -> bool {
    [
        "could not bind",
        "Address already in use",
        "could not create any TCP/IP sockets",
    ]
    .iter()
    .any(|needle| log.contains(needle))
}

/// Runs `cmd`, capturing its output; an error with both output streams if it
/// cannot be run or exits unsuccessfully.
fn run(cmd: &mut Command, what: &str) -> Result<Output, String> {
    let shown = show_command(cmd);
    let out = cmd
        .output()
        .map_err(|err| format!("could not run {what} ({shown}): {err}"))?;
    if out.status.success() {
        return Ok(out);
    }
    Err(format!(
        "{what} failed ({})\n--- command ---\n{shown}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout).trim_end(),
        String::from_utf8_lossy(&out.stderr).trim_end(),
    ))
}

/// Program and arguments of `cmd`, for error messages (without the long
/// list of removed environment variables that `Debug` would show).
fn show_command(cmd: &Command) -> String {
    let mut shown = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        shown.push(' ');
        shown.push_str(&arg.to_string_lossy());
    }
    shown
}

/// An error with all its sources; tokio-postgres's own message for a server
/// error is just "db error", the server's message is in the source.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Quotes a connection-string value when needed (empty, or containing
/// spaces, quotes or backslashes), as libpq and tokio-postgres expect.
fn conn_value(value: &str) -> String {
    let needs_quotes = value.is_empty()
        || value
            .chars()
            .any(|c| c.is_whitespace() || c == '\'' || c == '\\');
    if !needs_quotes {
        return value.to_owned();
    }
    let escaped = value.replace('\\', "\\\\").replace('\'', "\\'");
    format!("'{escaped}'")
}

/// SQL mode's stand-in for the reaper: `lease.sweep()` and
/// `lease.apply_write_backs()` every `every` as the test role, on a connection of its own (opened again after a restart),
/// until the flag is set.
fn spawn_sweeper(conn: String, every: Duration) -> (Arc<AtomicBool>, thread::JoinHandle<()>) {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let thread = thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            eprintln!("pg_tests: no runtime for the sweeper");
            return;
        };
        runtime.block_on(async move {
            let mut client: Option<tokio_postgres::Client> = None;
            while !flag.load(Ordering::Relaxed) {
                if client.as_ref().is_none_or(|c| c.is_closed()) {
                    client = match tokio_postgres::connect(&conn, tokio_postgres::NoTls).await {
                        Ok((c, connection)) => {
                            tokio::spawn(connection);
                            Some(c)
                        }
                        Err(_) => None,
                    };
                }
                if let Some(c) = &client {
                    // A failed sweep is retried at the next tick, as the
                    // reaper would; then the write-backs of the tables the
                    // test role owns, as the reaper's write-back worker would.
                    let _ = c
                        .batch_execute("SELECT lease.sweep(); SELECT lease.apply_write_backs()")
                        .await;
                }
                tokio::time::sleep(every).await;
            }
        });
    });
    (stop, thread)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_last_lines() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail("a", 5), "a");
        assert_eq!(tail("", 5), "");
    }

    #[test]
    fn conn_values_are_quoted_only_when_needed() {
        assert_eq!(conn_value("pg_lease_test"), "pg_lease_test");
        assert_eq!(conn_value(""), "''");
        assert_eq!(conn_value("my db"), "'my db'");
        assert_eq!(conn_value(r"o'k\"), r"'o\'k\\'");
    }

    #[test]
    fn port_conflicts_are_recognized() {
        assert!(is_port_conflict(
            "LOG:  could not bind IPv4 address \"127.0.0.1\": Address already in use"
        ));
        assert!(!is_port_conflict("FATAL:  could not load library"));
    }
}
