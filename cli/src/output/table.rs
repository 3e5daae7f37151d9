//! Plain aligned text tables for the terminal.

use std::time::Duration;

/// Rows under a header, each column as wide as its widest cell.
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn print(&self) {
        print!("{}", self.render());
    }

    fn render(&self) -> String {
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

/// A duration for people: `42 s`, `3 min`, `2 h`, `4 d`.
pub fn age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        7200..=172_799 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_and_ages_read_well() {
        let mut t = Table::new(&["id", "queue"]);
        t.row(vec!["1".into(), "emails".into()]);
        t.row(vec!["12345".into(), "q".into()]);
        assert_eq!(t.render(), "id     queue\n1      emails\n12345  q\n");
        assert_eq!(Table::new(&["x"]).render(), "x\n(none)\n");
        assert_eq!(age(Duration::from_secs(90)), "90 s");
        assert_eq!(age(Duration::from_secs(600)), "10 min");
        assert_eq!(age(Duration::from_secs(3 * 86_400)), "3 d");
    }
}
