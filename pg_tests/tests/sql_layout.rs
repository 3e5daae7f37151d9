// pg_tests: library only: it reads files and starts no cluster.
//! The layout of `sql/`: each file's `requires` in `extension/src/lib.rs`
//! names exactly the files (and the library's functions) whose objects its
//! SQL uses, so the list is the call graph and a reader can trust it. pgrx
//! refuses a cycle, so this also keeps the files' concepts layered.
//!
//! Read as text, without a server: what counts as a use is a `lease.<name>`
//! in code, outside comments, string literals (messages, hints, dynamic SQL)
//! and `COMMENT ON` statements.
//!
//! Failed before the fix: the lists of 13 of the 17 files were off
//! (`claim` required only `access` and `lease` but used `check`, `metrics`
//! and `outcome` too), and the files were not layered: `attach` used
//! `outcome`, which used `attach`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

/// `sql` with comments, string literals and `COMMENT ON` statements
/// blanked out; dollar-quoted bodies stay (they are code).
fn code_of(sql: &str) -> String {
    let bytes = sql.as_bytes();
    let mut out = String::with_capacity(sql.len());
    let mut i = 0;
    let mut in_body = false;
    while i < bytes.len() {
        let rest = &sql[i..];
        if rest.starts_with("--") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with('\'') {
            i += 1;
            while i < bytes.len() {
                if bytes[i] == b'\'' {
                    if bytes.get(i + 1) == Some(&b'\'') {
                        i += 2;
                        continue;
                    }
                    break;
                }
                i += 1;
            }
            i += 1;
            out.push_str("''");
        } else if rest.starts_with("$$") {
            in_body = !in_body;
            i += 2;
            out.push_str(" $$ ");
        } else if !in_body && rest.starts_with("COMMENT ON ") {
            i += statement_end(rest);
        } else {
            let c = rest.chars().next().expect("not at the end");
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The length of the statement at the start of `rest`, through its `;`,
/// with its string and dollar-quoted literals taken whole.
fn statement_end(rest: &str) -> usize {
    let mut i = 0;
    while i < rest.len() {
        let tail = &rest[i..];
        if let Some(body) = tail.strip_prefix("$$") {
            i += 2 + body.find("$$").map_or(body.len(), |e| e + 2);
        } else if let Some(text) = tail.strip_prefix('\'') {
            // '' inside a literal closes and reopens it: the same end.
            i += 1 + text.find('\'').map_or(text.len(), |e| e + 1);
        } else if tail.starts_with(';') {
            return i + 1;
        } else {
            i += tail.chars().next().map_or(1, char::len_utf8);
        }
    }
    rest.len()
}

fn words(code: &str) -> Vec<&str> {
    code.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.'))
        .filter(|w| !w.is_empty())
        .collect()
}

/// Per SQL file (without `.sql`): the `lease.` objects it creates, and the
/// ones it uses.
fn sql_files() -> BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> {
    let mut files = BTreeMap::new();
    for entry in fs::read_dir(root().join("sql")).expect("sql/") {
        let path = entry.expect("entry").path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        // The install without the library's stand-ins are not part of the
        // extension's script.
        let Some(stem) = name
            .strip_suffix(".sql")
            .filter(|s| *s != "without_library")
        else {
            continue;
        };
        let code = code_of(&fs::read_to_string(&path).expect("read"));
        let words = words(&code);
        let (mut made, mut used) = (BTreeSet::new(), BTreeSet::new());
        for (i, w) in words.iter().enumerate() {
            let Some(object) = w.strip_prefix("lease.") else {
                continue;
            };
            let kind = i.checked_sub(1).map(|k| words[k]);
            let verb = words[..i.saturating_sub(1)]
                .iter()
                .rev()
                .find(|w| !matches!(**w, "OR" | "REPLACE"));
            if verb == Some(&"CREATE")
                && matches!(kind, Some("FUNCTION" | "VIEW" | "TABLE" | "TYPE"))
            {
                made.insert(object.to_owned());
            } else {
                used.insert(object.to_owned());
            }
        }
        files.insert(stem.to_owned(), (made, used));
    }
    files
}

/// The library's functions: Rust name -> SQL name.
fn library_functions() -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for entry in fs::read_dir(root().join("extension/src")).expect("extension/src") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = fs::read_to_string(path).expect("read");
        for attr in text.split("#[pg_extern").skip(1) {
            let head = &attr[..attr.find(")]").unwrap_or(0)];
            let sql_name = head
                .split("name = \"")
                .nth(1)
                .and_then(|n| n.split('"').next());
            let Some(fn_name) = attr.split("fn ").nth(1).and_then(|f| f.split('(').next()) else {
                continue;
            };
            names.insert(fn_name.to_owned(), sql_name.unwrap_or(fn_name).to_owned());
        }
    }
    names
}

/// Per SQL file of lib.rs: its `requires` (files, and the SQL names of
/// library functions); bootstrap and finalize files have none to check.
fn requires() -> BTreeMap<String, BTreeSet<String>> {
    let library = library_functions();
    let lib = fs::read_to_string(root().join("extension/src/lib.rs")).expect("lib.rs");
    let mut out = BTreeMap::new();
    for call in lib.split("extension_sql_file!(").skip(1) {
        let call = &call[..call.find(");").expect("the macro's end")];
        let file = call
            .split("sql/")
            .nth(1)
            .and_then(|f| f.split(".sql").next())
            .expect("a file under sql/");
        let Some(list) = call.split("requires = [").nth(1) else {
            continue;
        };
        let list = &list[..list.find(']').expect("the list's end")];
        let names = list
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(|n| match n.strip_prefix('"') {
                Some(quoted) => quoted.trim_end_matches('"').to_owned(),
                None => {
                    let rust = n.rsplit("::").next().unwrap_or(n);
                    library
                        .get(rust)
                        .cloned()
                        .unwrap_or_else(|| format!("? {n}"))
                }
            })
            .collect();
        out.insert(file.to_owned(), names);
    }
    out
}

#[test]
fn requires_name_exactly_what_each_sql_file_uses() {
    let files = sql_files();
    let library: BTreeSet<String> = library_functions().into_values().collect();
    let mut home = BTreeMap::new();
    for (file, (made, _)) in &files {
        for object in made {
            home.entry(object.clone()).or_insert_with(|| file.clone());
        }
    }
    let mut wrong = Vec::new();
    for (file, listed) in requires() {
        let (_, used) = &files[&file];
        let needed: BTreeSet<String> = used
            .iter()
            .filter_map(|object| match home.get(object) {
                Some(f) if *f != file => Some(f.clone()),
                Some(_) => None,
                None => library.contains(object).then(|| object.clone()),
            })
            .collect();
        if needed != listed {
            wrong.push(format!("{file}: requires {listed:?}, uses {needed:?}"));
        }
    }
    assert!(wrong.is_empty(), "requires off:\n{}", wrong.join("\n"));
}

/// The reader's check of `code_of`: what it blanks and what it keeps.
#[test]
fn code_of_keeps_bodies_and_drops_prose() {
    let sql =
        "CREATE FUNCTION lease.a() RETURNS int LANGUAGE sql AS $$ SELECT lease.b('lease.c') $$;\n\
               -- lease.d\n\
               COMMENT ON FUNCTION lease.a() IS $$calls lease.e$$;\n\
               COMMENT ON FUNCTION lease.b() IS 'it''s lease.f';\n\
               SELECT lease.g();";
    let code = code_of(sql);
    for kept in ["lease.a", "lease.b", "lease.g"] {
        assert!(code.contains(kept), "{kept} in {code}");
    }
    for dropped in ["lease.c", "lease.d", "lease.e", "lease.f"] {
        assert!(!code.contains(dropped), "{dropped} in {code}");
    }
}
