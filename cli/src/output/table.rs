//! Plain aligned text for the terminal: tables, and fields of one record.

/// Rows under a header, each column as wide as its widest cell.
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table with these column names.
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row, one cell per column.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The text: header, rows, or `(none)` under the header.
    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: &[String]| -> String {
            let padded: Vec<String> = cells
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect();
            format!("{}\n", padded.join("  ").trim_end())
        };
        let mut out = line(&self.header);
        for row in &self.rows {
            out.push_str(&line(row));
        }
        if self.rows.is_empty() {
            out.push_str("(none)\n");
        }
        out
    }
}

/// One record as `name  value` lines, names aligned; a value of several
/// lines (a pretty-printed payload) continues under the first.
pub fn fields(pairs: &[(&str, String)]) -> String {
    let width = pairs
        .iter()
        .map(|(n, _)| n.chars().count())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for (name, value) in pairs {
        let mut lines = value.lines();
        let first = lines.next().unwrap_or("");
        out.push_str(format!("{name:<width$}  {first}").trim_end());
        out.push('\n');
        for more in lines {
            out.push_str(&format!("{:width$}  {more}\n", ""));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align() {
        let mut t = Table::new(&["id", "queue"]);
        t.row(vec!["1".into(), "emails".into()]);
        t.row(vec!["12345".into(), "q".into()]);
        assert_eq!(t.render(), "id     queue\n1      emails\n12345  q\n");
        assert_eq!(Table::new(&["x"]).render(), "x\n(none)\n");
    }

    #[test]
    fn fields_align_and_continue_lines() {
        let text = fields(&[
            ("id", "7".into()),
            ("payload", "{\n  \"a\": 1\n}".into()),
            ("key", String::new()),
        ]);
        assert_eq!(
            text,
            "id       7\npayload  {\n           \"a\": 1\n         }\nkey\n"
        );
    }
}
