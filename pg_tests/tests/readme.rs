// pg_tests: library only: it reads files and starts no cluster.
//! The documents' examples run as written: the SQL block of
//! `docs/attached-tables.md` through psql against a real cluster, and each
//! Rust block shown (that guide's, the README's outbox) is the code of an
//! example under `client/examples/` that `bin/test` runs.

use std::path::Path;
use std::process::Command;

use pg_tests::{pg_bin_dir, Cluster, SUPERUSER, TEST_DB};

/// Where the worked example is.
const GUIDE: &str = "docs/attached-tables.md";

fn repo_file(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("read {}: {e}", full.display()))
}

/// The body of the first fenced code block after `marker` (or after the
/// first line starting with `opening` when `marker` is empty).
fn code_block_after(text: &str, marker: &str, opening: &str) -> String {
    let start = text.find(marker).expect("marker in the document");
    let rest = &text[start..];
    let open = rest.find(opening).expect("opening fence") + opening.len();
    let body = &rest[open..];
    let close = body.find("\n```").expect("closing fence");
    body[..close].trim_start_matches('\n').to_owned() + "\n"
}

#[test]
fn the_attach_sql_example_runs_as_written() {
    let guide = repo_file(GUIDE);
    let sql = code_block_after(&guide, "<!-- attach-sql -->", "```sql");
    let cluster = Cluster::start();
    let out = Command::new(pg_bin_dir().join("psql"))
        .args(["-h", "127.0.0.1", "-p", &cluster.port().to_string()])
        .args(["-U", SUPERUSER, "-d", TEST_DB])
        .args(["-X", "-v", "ON_ERROR_STOP=1", "-A", "-t", "-q"])
        .arg("-f")
        .arg("-")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(sql.as_bytes())?;
            child.wait_with_output()
        })
        .expect("run psql");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the SQL of {GUIDE} failed:\n{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The last query's answer: row 1 is done, row 3 still pending.
    assert_eq!(stdout.lines().last(), Some("3|pending"), "{stdout}");
    assert_eq!(
        cluster.psql(
            TEST_DB,
            "SELECT string_agg(id || ':' || status, ',' ORDER BY id) FROM service_instances"
        ),
        "1:DELETED,2:RUNNING,3:SCHEDULED,4:CANCELLED\n"
    );
}

/// The lines between `// [marker]` and `// [/marker]` of `example`,
/// dedented: what a document shows of it.
fn example_region(example: &str, marker: &str) -> String {
    let text = repo_file(example);
    let region = text
        .split(&format!("// [{marker}]"))
        .nth(1)
        .and_then(|rest| rest.split(&format!("// [/{marker}]")).next())
        .unwrap_or_else(|| panic!("[{marker}] markers in {example}"));
    let lines: Vec<&str> = region.lines().skip(1).collect();
    let indent = lines
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    lines
        .iter()
        .map(|l| format!("{}\n", l.get(indent..).unwrap_or("").trim_end()))
        .collect::<String>()
        .trim_end()
        .to_owned()
        + "\n"
}

#[test]
fn the_attach_rust_example_is_the_examples_code() {
    let shown = code_block_after(&repo_file(GUIDE), "<!-- attach-sql -->", "```rust");
    assert_eq!(
        shown,
        example_region("client/examples/attached_table.rs", "attach"),
        "the Rust block of {GUIDE} differs from client/examples/attached_table.rs"
    );
}

/// The README's "Use it from your application" blocks are the outbox
/// example's `place_order` and `place_order_sqlx`, which `bin/test` runs.
#[test]
fn the_readme_outbox_examples_are_the_examples_code() {
    let readme = repo_file("README.md");
    for marker in ["outbox", "outbox-sqlx"] {
        let shown = code_block_after(&readme, &format!("<!-- {marker} -->"), "```rust");
        assert_eq!(
            shown,
            example_region("client/examples/outbox.rs", marker),
            "the {marker} block of README.md differs from client/examples/outbox.rs"
        );
    }
}
