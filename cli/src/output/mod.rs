//! Where answers go: aligned text for people, or (`--json`) one JSON
//! document per command for programs. Commands build both forms from the
//! same rows; this module writes them.

mod table;
mod time;

use std::io::{IsTerminal, Write};
use std::time::SystemTime;

use serde_json::Value;

pub use table::{fields, Table};
pub use time::{age, relative, rfc3339, secs, span};

use crate::error::CliError;

/// The output format chosen on the command line.
#[derive(Clone, Copy, Debug)]
pub struct Output {
    json: bool,
}

impl Output {
    /// JSON when `json`, text otherwise.
    pub fn new(json: bool) -> Output {
        Output { json }
    }

    /// True with `--json`.
    pub fn is_json(&self) -> bool {
        self.json
    }

    /// Text as it is.
    pub fn text(&self, text: &str) -> Result<(), CliError> {
        write_stdout(text)
    }

    /// One pretty-printed JSON document.
    pub fn json(&self, value: &Value) -> Result<(), CliError> {
        write_stdout(&format!("{}\n", serde_json::to_string_pretty(value)?))
    }

    /// One JSON document on one line (`watch`: JSON Lines).
    pub fn json_line(&self, value: &Value) -> Result<(), CliError> {
        write_stdout(&format!("{}\n", serde_json::to_string(value)?))
    }

    /// Whether stdout is a terminal (`watch` clears it between refreshes).
    pub fn is_terminal(&self) -> bool {
        std::io::stdout().is_terminal()
    }
}

/// Writes and flushes, so that a closed pipe shows as an error here rather
/// than as a panic inside `print!`.
fn write_stdout(text: &str) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// A time for JSON: RFC 3339 text, or null.
pub fn time_json(t: Option<SystemTime>) -> Value {
    t.map_or(Value::Null, |t| Value::String(rfc3339(t)))
}

/// A time for a table: RFC 3339 and how far from now, or empty.
pub fn time_text(t: Option<SystemTime>, now: SystemTime) -> String {
    t.map(|t| format!("{} ({})", rfc3339(t), relative(t, now)))
        .unwrap_or_default()
}

/// At most `max` characters of the first line of `text`, `…` marking a cut.
pub fn first_line(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or("");
    if line.chars().count() <= max && line.len() == text.trim_end().len() {
        return line.to_owned();
    }
    let cut: String = line.chars().take(max.saturating_sub(1)).collect();
    format!("{cut}…")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_errors_are_cut_for_tables() {
        assert_eq!(first_line("short", 10), "short");
        assert_eq!(first_line("0123456789abc", 10), "012345678…");
        assert_eq!(first_line("one\ntwo", 10), "one…");
        assert_eq!(first_line("", 10), "");
    }
}
