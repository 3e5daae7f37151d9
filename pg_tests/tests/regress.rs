// pg_tests: library only: its golden files are those of CREATE EXTENSION.
//! Golden-file SQL tests in the style of pg_regress: each
//! `regress/sql/NAME.sql` runs through psql (statements echoed, errors shown
//! as their SQLSTATE only) in a fresh database with the extension, and its
//! output must equal `regress/expected/NAME.out` byte for byte, so that a
//! reviewer reads the SQL surface's behaviour as text and any change to a
//! result or a SQLSTATE fails here with a diff.
//!
//! `PG_LEASE_REGRESS_ACCEPT=1` writes the outputs as the new expected files
//! instead (then read the diff in git before committing it).
//!
//! Failed before the golden files existed.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use pg_tests::{pg_bin_dir, Cluster, SUPERUSER};

fn regress_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("regress")
}

/// psql's output for `sql_file` in database `db`: input echoed, errors
/// (which psql writes to stderr) in their place among the results, no
/// psqlrc.
fn run(cluster: &Cluster, db: &str, sql_file: &Path) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#""$0" -h 127.0.0.1 -p "$1" -U "$2" -d "$3" -X -a -q -f "$4" 2>&1"#)
        .arg(pg_bin_dir().join("psql"))
        .arg(cluster.port().to_string())
        .arg(SUPERUSER)
        .arg(db)
        .arg(sql_file)
        .stdin(Stdio::null())
        .output()
        .expect("psql");
    String::from_utf8_lossy(&out.stdout)
        // psql names the file in each error line: not this machine's path.
        .replace(
            &sql_file.display().to_string(),
            &sql_file
                .file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default(),
        )
}

#[test]
fn sql_files_give_their_expected_output() {
    let accept = std::env::var_os("PG_LEASE_REGRESS_ACCEPT").is_some();
    let cluster = Cluster::start();
    let mut names: Vec<String> = std::fs::read_dir(regress_dir().join("sql"))
        .expect("regress/sql")
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".sql"))
                .map(str::to_owned)
        })
        .collect();
    names.sort();
    assert!(!names.is_empty(), "no golden files");
    let mut failed = Vec::new();
    for name in &names {
        let db = format!("regress_{name}");
        cluster.psql(pg_tests::TEST_DB, &format!("CREATE DATABASE {db}"));
        cluster.psql(&db, "CREATE EXTENSION pg_lease");
        let got = run(
            &cluster,
            &db,
            &regress_dir().join("sql").join(format!("{name}.sql")),
        );
        let expected_path = regress_dir().join("expected").join(format!("{name}.out"));
        if accept {
            std::fs::write(&expected_path, &got).expect("write expected");
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
        if got != expected {
            let got_path = std::env::temp_dir().join(format!("pg_lease_regress_{name}.out"));
            std::fs::write(&got_path, &got).expect("write output");
            let diff = Command::new("diff")
                .arg("-u")
                .arg(&expected_path)
                .arg(&got_path)
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            failed.push(format!("{name}:\n{diff}"));
        }
    }
    assert!(
        failed.is_empty(),
        "output differs from regress/expected (PG_LEASE_REGRESS_ACCEPT=1 rewrites it):\n{}",
        failed.join("\n")
    );
}
