// pg_tests: library only: it reads files and starts no cluster.
//! The SQL reference, `docs/sql.md`, says what the objects' own comments
//! say: for every public function and view of the extension, its entry in
//! the reference holds its `COMMENT ON` text and its declaration (from
//! `CREATE FUNCTION` to the `RETURNS` clause) as written in `sql/*.sql` (or,
//! for functions written in Rust, in the `extension_sql!` blocks of
//! `extension/src/*.rs`). A function missing from the reference, an entry
//! for a function that does not exist (or is internal: `_`-prefixed, or
//! commented "Internal"), and an entry whose text differs all fail. A
//! function is `_`-prefixed exactly when its comment says "Internal".
//! `bin/sql-doc` writes the entries; this test needs neither it nor a
//! server.
//!
//! Shown to fail against deliberate edits, each reported by name until
//! reverted: one word of `lease.pause`'s comment changed in `sql/queue.sql`;
//! the entry of `lease.revoke` removed from `docs/sql.md`; and the marker of
//! `lease.pause` given a second argument type (a function that does not
//! exist).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

/// What the reference must show for one object.
#[derive(Debug, PartialEq)]
struct Entry {
    declaration: Option<String>,
    comment: String,
}

/// The value of the SQL literal at the start of `text` (`$$…$$` or
/// `'…'` with `''` for a quote), and the rest after it.
fn literal(text: &str) -> Option<(String, &str)> {
    if let Some(body) = text.strip_prefix("$$") {
        let end = body.find("$$")?;
        return Some((body[..end].to_owned(), &body[end + 2..]));
    }
    let body = text.strip_prefix('\'')?;
    let mut value = String::new();
    let mut rest = body;
    loop {
        let end = rest.find('\'')?;
        value.push_str(&rest[..end]);
        rest = &rest[end + 1..];
        match rest.strip_prefix('\'') {
            Some(after) => {
                value.push('\'');
                rest = after;
            }
            None => return Some((value, rest)),
        }
    }
}

/// The `CREATE FUNCTION` of `name` last before `before` in `source`, from
/// its first line up to the line starting with `LANGUAGE`, each line
/// without trailing blanks; `None` when the source does not declare it.
fn declaration(source: &str, name: &str, before: usize) -> Option<String> {
    let start = ["CREATE FUNCTION ", "CREATE OR REPLACE FUNCTION "]
        .iter()
        .flat_map(|create| {
            let needle = format!("{create}{name}(");
            source[..before]
                .match_indices(&needle)
                .filter(|(at, _)| *at == 0 || source.as_bytes()[at - 1] == b'\n')
                .map(|(at, _)| at)
                .collect::<Vec<_>>()
        })
        .max()?;
    let lines: Vec<&str> = source[start..]
        .lines()
        .take_while(|line| !line.starts_with("LANGUAGE"))
        .map(str::trim_end)
        .collect();
    Some(lines.join("\n"))
}

/// The public functions and views commented in `source`, keyed as the
/// reference's markers name them: `lease.f(type, ...)`, `view lease.v`;
/// functions whose name and comment disagree on being internal go to
/// `misnamed`.
fn public_objects(source: &str, into: &mut BTreeMap<String, Entry>, misnamed: &mut Vec<String>) {
    for kind in ["FUNCTION", "VIEW"] {
        let opening = format!("COMMENT ON {kind} lease.");
        for (at, _) in source.match_indices(&opening) {
            let rest = &source[at + opening.len()..];
            let name_len = rest
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
                .unwrap_or(rest.len());
            let name = format!("lease.{}", &rest[..name_len]);
            let mut rest = &rest[name_len..];
            let mut args = String::new();
            if kind == "FUNCTION" {
                let close = rest.find(')').expect("argument list") + 1;
                args = rest[..close].to_owned();
                rest = &rest[close..];
            }
            let rest = rest
                .trim_start()
                .strip_prefix("IS")
                .expect("IS")
                .trim_start();
            let (comment, _) =
                literal(rest).unwrap_or_else(|| panic!("the comment of {name}{args}"));
            let underscored = name.starts_with("lease._");
            let internal = comment.trim_start().starts_with("Internal");
            if kind == "FUNCTION" && underscored != internal {
                misnamed.push(format!("{name}{args}"));
            }
            if underscored || internal {
                continue;
            }
            let (key, declaration) = if kind == "VIEW" {
                (format!("view {name}"), None)
            } else {
                (format!("{name}{args}"), declaration(source, &name, at))
            };
            let comment = comment.trim_matches('\n').to_owned();
            let old = into.insert(
                key.clone(),
                Entry {
                    declaration,
                    comment,
                },
            );
            assert!(old.is_none(), "{key} is commented twice");
        }
    }
}

/// Every public object of the extension's sources, and the functions
/// whose name and comment disagree on being internal.
fn sources() -> (BTreeMap<String, Entry>, Vec<String>) {
    let mut objects = BTreeMap::new();
    let mut misnamed = Vec::new();
    for (dir, ext) in [("sql", "sql"), ("extension/src", "rs")] {
        let mut files: Vec<PathBuf> = fs::read_dir(root().join(dir))
            .expect("source directory")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == ext))
            .collect();
        files.sort();
        for file in files {
            let source = fs::read_to_string(&file).expect("read a source file");
            public_objects(&source, &mut objects, &mut misnamed);
        }
    }
    (objects, misnamed)
}

/// The body of the fenced block opened by `opening` in `text`, if any.
fn block(text: &str, opening: &str) -> Option<String> {
    let start = text.find(opening)? + opening.len();
    let body = &text[start..];
    let end = body.find("\n```").unwrap_or(body.len());
    Some(body[..end].to_owned())
}

/// The entries of the reference, keyed by their `<!-- sql-doc: … -->`
/// markers; each runs to the next marker or the end of its region.
fn documented(doc: &str) -> BTreeMap<String, Entry> {
    const MARKER: &str = "<!-- sql-doc: ";
    let mut entries = BTreeMap::new();
    let mut rest = doc;
    while let Some(at) = rest.find(MARKER) {
        rest = &rest[at + MARKER.len()..];
        let close = rest.find(" -->").expect("marker end");
        let key = rest[..close].to_owned();
        rest = &rest[close..];
        let end = [rest.find(MARKER), rest.find("<!-- end of generated -->")]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(rest.len());
        let text = &rest[..end];
        let entry = Entry {
            declaration: block(text, "```sql\n"),
            comment: block(text, "```text\n").unwrap_or_default(),
        };
        assert!(
            entries.insert(key.clone(), entry).is_none(),
            "docs/sql.md documents {key} twice"
        );
    }
    entries
}

#[test]
fn the_sql_reference_is_the_comments() {
    let doc = fs::read_to_string(root().join("docs/sql.md")).expect("read docs/sql.md");
    let documented = documented(&doc);
    let (sources, _) = sources();
    assert!(
        sources.len() > 40,
        "found only {} public objects: is the parser still reading the sources?",
        sources.len()
    );
    let mut problems = Vec::new();
    for (key, entry) in &sources {
        match documented.get(key) {
            None => problems.push(format!("{key} is not in docs/sql.md")),
            Some(shown) if shown.comment != entry.comment => problems.push(format!(
                "{key}: docs/sql.md says\n{}\nbut its COMMENT ON says\n{}",
                shown.comment, entry.comment
            )),
            Some(shown) if shown.declaration != entry.declaration => problems.push(format!(
                "{key}: docs/sql.md declares it as\n{:?}\nbut the source as\n{:?}",
                shown.declaration, entry.declaration
            )),
            Some(_) => {}
        }
    }
    for key in documented.keys() {
        if !sources.contains_key(key) {
            problems.push(format!(
                "docs/sql.md documents {key}, which is no public function or view"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "docs/sql.md and the COMMENT ONs disagree (run bin/sql-doc):\n\n{}",
        problems.join("\n\n")
    );
}

/// Internal functions are named so: a function is `_`-prefixed exactly when
/// its comment starts with "Internal". (Failed with 21 functions commented
/// "Internal" under public-looking names, the argument checks among them.)
#[test]
fn internal_functions_and_only_they_are_underscored() {
    let (_, misnamed) = sources();
    assert!(
        misnamed.is_empty(),
        "named and commented differently (internal: `_` prefix and a comment starting \"Internal\"):\n{}",
        misnamed.join("\n")
    );
}
