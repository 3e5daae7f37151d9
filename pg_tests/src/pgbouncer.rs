//! A real PgBouncer in front of a test [`Cluster`]: transaction pooling,
//! its own directory and port on 127.0.0.1, run as the server's OS user
//! (PgBouncer, like PostgreSQL, refuses to run as root). `bin/prereqs`
//! installs Debian's package.
//!
//! Dropping the [`Bouncer`] kills it and deletes its directory.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::{
    conn_value, create_unique_dir, free_port, run_as, test_user, Cluster, RunAs, POSTGRES_OS_USER,
    SUPERUSER,
};

/// Where Debian's package puts the program.
const PROGRAM: &str = "/usr/sbin/pgbouncer";

/// Server connections per (database, user) pool: fewer than the clients
/// the tests open, so that transactions of one client really move between
/// server connections.
pub const POOL_SIZE: u32 = 3;

/// A running PgBouncer in transaction mode.
#[derive(Debug)]
pub struct Bouncer {
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
}

impl Bouncer {
    /// Starts PgBouncer in front of `cluster`, letting in its superuser,
    /// the tests' role and `users`. Panics with PgBouncer's log if it does
    /// not accept connections within 10 s.
    pub fn start(cluster: &Cluster, users: &[&str]) -> Bouncer {
        let dir = create_unique_dir().expect("pgbouncer directory");
        let port = free_port().expect("a port for pgbouncer");
        let mut names = vec![SUPERUSER, test_user()];
        names.extend_from_slice(users);
        let auth: String = names
            .iter()
            .map(|name| format!("\"{name}\" \"\"\n"))
            .collect();
        fs::write(dir.join("users.txt"), auth).expect("auth file");
        fs::write(
            dir.join("pgbouncer.ini"),
            config(&dir, port, cluster.port()),
        )
        .expect("pgbouncer.ini");
        if let Ok(RunAs::PostgresUser { uid, gid }) = run_as() {
            for path in [
                dir.clone(),
                dir.join("users.txt"),
                dir.join("pgbouncer.ini"),
            ] {
                std::os::unix::fs::chown(&path, Some(uid), Some(gid)).expect("chown");
            }
        }
        let mut bouncer = Bouncer {
            dir,
            port,
            child: None,
        };
        bouncer.launch();
        bouncer
    }

    /// PgBouncer's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A connection string to `db` as `user` through PgBouncer.
    pub fn conn_string(&self, db: &str, user: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user={} dbname={} connect_timeout=5",
            self.port,
            conn_value(user),
            conn_value(db)
        )
    }

    /// Kills PgBouncer (SIGKILL: every client and server connection drops
    /// at once), waits `down`, and starts it again on the same port.
    pub fn restart(&mut self, down: Duration) {
        self.kill();
        thread::sleep(down);
        self.launch();
    }

    /// PgBouncer's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }

    fn launch(&mut self) {
        let ini = self.dir.join("pgbouncer.ini");
        let mut cmd = match run_as() {
            Ok(RunAs::PostgresUser { .. }) => {
                let mut cmd = Command::new("runuser");
                cmd.args(["-u", POSTGRES_OS_USER, "--", PROGRAM]);
                cmd
            }
            _ => Command::new(PROGRAM),
        };
        cmd.arg(&ini)
            .current_dir(std::env::temp_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!("pg_tests: could not start {PROGRAM} (bin/prereqs installs it): {e}")
        });
        self.child = Some(child);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "pg_tests: pgbouncer did not listen on port {} within 10 s; its log:\n{}",
            self.port,
            self.log()
        );
    }

    /// Kills the PgBouncer process (its pid file names it: under `runuser`
    /// the child is not PgBouncer itself) and reaps the child.
    fn kill(&mut self) {
        if let Some(pid) = read_pid(&self.dir.join("pgbouncer.pid")) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            let start = Instant::now();
            while crate::process_alive(pid) && start.elapsed() < Duration::from_secs(5) {
                thread::sleep(Duration::from_millis(10));
            }
            let _ = fs::remove_file(self.dir.join("pgbouncer.pid"));
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        self.kill();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn read_pid(path: &Path) -> Option<u32> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Transaction pooling with [`POOL_SIZE`] server connections per pool,
/// trusting the listed users (the cluster trusts everyone anyway).
fn config(dir: &Path, port: u16, server_port: u16) -> String {
    format!(
        "[databases]
* = host=127.0.0.1 port={server_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {dir}/users.txt
pool_mode = transaction
default_pool_size = {POOL_SIZE}
max_client_conn = 200
server_reset_query =
ignore_startup_parameters = extra_float_digits
logfile = {dir}/pgbouncer.log
pidfile = {dir}/pgbouncer.pid
",
        dir = dir.display()
    )
}
