// pg_tests: library only: it reads files and starts no cluster.
//! Every relative link of the project's Markdown resolves: the file or
//! directory exists, and a `#fragment` into a Markdown file names one of
//! its headings (as GitHub makes anchors of them). Links to the web are
//! not followed.
//!
//! Failed before the fix: none of the documents was checked, and the
//! README's line limit came with "every link in it resolves".

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

/// The Markdown files checked: the top level's, `docs/` and its
/// subdirectories, and the crates' READMEs.
fn documents() -> Vec<PathBuf> {
    let root = root();
    let mut files = Vec::new();
    let mut dirs = vec![root.clone(), root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).expect("a directory") {
            let path = entry.expect("an entry").path();
            if path.is_dir() && path.starts_with(root.join("docs")) {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    for krate in ["benches", "client", "cli", "extension", "pg_tests"] {
        let readme = root.join(krate).join("README.md");
        if readme.exists() {
            files.push(readme);
        }
    }
    files.sort();
    files
}

/// The lines of `text` outside fenced code blocks.
fn unfenced(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// The text outside fenced code blocks with inline code blanked out, so
/// that `[a](b)` inside code is not taken for a link.
fn prose(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in unfenced(text) {
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
            }
            out.push(if in_code { ' ' } else { c });
        }
        out.push('\n');
    }
    out
}

/// The targets of the inline links and images (`[text](target)`) of `text`.
fn link_targets(text: &str) -> Vec<String> {
    let text = prose(text);
    let mut targets = Vec::new();
    for (at, _) in text.match_indices("](") {
        let rest = &text[at + 2..];
        let Some(end) = rest.find(')') else { continue };
        let target = rest[..end].split_whitespace().next().unwrap_or("");
        targets.push(target.to_owned());
    }
    targets
}

/// GitHub's anchor for a heading: lower case, punctuation other than `-`
/// and `_` dropped, spaces made `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown file: its headings' (duplicates get `-1`,
/// `-2`…) and those set by hand with `<a id="…">`.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for (at, _) in text.match_indices("<a id=\"") {
        let rest = &text[at + 7..];
        if let Some(end) = rest.find('"') {
            seen.insert(rest[..end].to_owned());
        }
    }
    for line in unfenced(text) {
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let base = anchor(heading);
        let mut name = base.clone();
        let mut n = 0;
        while !seen.insert(name.clone()) {
            n += 1;
            name = format!("{base}-{n}");
        }
    }
    seen
}

/// What is wrong with `target`, linked from `from`, if anything.
fn broken(from: &Path, target: &str) -> Option<String> {
    if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (path, fragment) = match target.split_once('#') {
        Some((path, fragment)) => (path, Some(fragment)),
        None => (target, None),
    };
    let file = if path.is_empty() {
        from.to_path_buf()
    } else {
        from.parent().expect("a directory").join(path)
    };
    if !file.exists() {
        return Some(format!("{target}: no such file"));
    }
    let fragment = fragment?;
    if file.extension().is_none_or(|e| e != "md") {
        return None;
    }
    let text = fs::read_to_string(&file).expect("read a linked document");
    (!anchors(&text).contains(fragment)).then(|| format!("{target}: no such heading"))
}

#[test]
fn every_relative_link_resolves() {
    let root = root();
    let documents = documents();
    assert!(
        documents.len() > 10,
        "found only {} documents: is the walk still reading the tree?",
        documents.len()
    );
    let mut problems = Vec::new();
    let mut checked = 0;
    for document in &documents {
        let text = fs::read_to_string(document).expect("read a document");
        for target in link_targets(&text) {
            checked += 1;
            if let Some(problem) = broken(document, &target) {
                let name = document.strip_prefix(&root).unwrap_or(document);
                problems.push(format!("{}: {problem}", name.display()));
            }
        }
    }
    assert!(checked > 50, "found only {checked} links");
    assert!(
        problems.is_empty(),
        "links that do not resolve:\n{}",
        problems.join("\n")
    );
}

#[test]
fn anchors_follow_github() {
    assert_eq!(anchor(" Installing"), "installing");
    assert_eq!(
        anchor(" `lease.claim_pending` (the claim)"),
        "leaseclaim_pending-the-claim"
    );
    let text = "# A\n## A\n```\n# not a heading\n```\n#nor this\n<a id=\"set\"></a>\n";
    assert_eq!(
        anchors(text),
        BTreeSet::from(["a".to_owned(), "a-1".to_owned(), "set".to_owned()])
    );
}
