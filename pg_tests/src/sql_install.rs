//! The install without the library (`bin/sql-install`) in a test cluster:
//! its script, and running a script through psql as a given role.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::{pg_bin_dir, Cluster};

/// `bin/sql-install`'s script, made from the extension script installed in
/// the server under test ([`pg_bin_dir`]'s `pg_config`).
pub fn script() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(root.join("bin/sql-install"))
        .env("PG_CONFIG", pg_bin_dir().join("pg_config"))
        .output()
        .expect("run bin/sql-install");
    assert!(
        out.status.success(),
        "bin/sql-install failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// Runs `sql` through psql as `user` in database `db` of `cluster`,
/// stopping at the first error; panics with psql's errors if one fails.
pub fn psql_as(cluster: &Cluster, user: &str, db: &str, sql: &str) {
    let mut child = Command::new(pg_bin_dir().join("psql"))
        .args(["-h", "127.0.0.1", "-p", &cluster.port().to_string()])
        .args([
            "-U",
            user,
            "-d",
            db,
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-f",
            "-",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("psql");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(sql.as_bytes())
        .expect("write to psql");
    let out = child.wait_with_output().expect("psql");
    assert!(
        out.status.success(),
        "psql as {user} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An operator's part of the install, as the superuser: pg_lease's two
/// roles if they are missing, and login role `owner` (no other attribute)
/// made a `lease_admin`.
pub const OPERATOR_SQL: &str = "DO $$ BEGIN
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'lease_worker') THEN
            CREATE ROLE lease_worker NOLOGIN;
        END IF;
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'lease_admin') THEN
            CREATE ROLE lease_admin NOLOGIN IN ROLE lease_worker;
        END IF;
        EXECUTE format('CREATE ROLE %I LOGIN IN ROLE lease_admin', current_setting('pg_tests.owner'));
    END $$";

/// [`OPERATOR_SQL`] for `owner`, then database `db` owned by `owner`, where
/// `owner` installs pg_lease with [`script`].
pub fn install_as_owner(cluster: &Cluster, owner: &str, db: &str) {
    cluster.psql(
        crate::TEST_DB,
        &format!("SET pg_tests.owner = '{owner}'; {OPERATOR_SQL}"),
    );
    cluster.psql(
        crate::TEST_DB,
        &format!("CREATE DATABASE {db} OWNER {owner}"),
    );
    psql_as(cluster, owner, db, &script());
}
