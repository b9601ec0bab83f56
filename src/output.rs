//! Rendering: aligned plain-text tables for people, JSON for tools.

use std::io::Write;

use serde::Serialize;

use crate::error::CliError;

/// A plain-text table with left-aligned columns; columns listed in `right` are
/// right-aligned (numbers).
#[derive(Debug, Clone, Default)]
pub struct Table {
    headers: Vec<String>,
    right: Vec<usize>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&str]) -> Self {
        Self {
            headers: headers.iter().map(|h| (*h).to_owned()).collect(),
            right: Vec::new(),
            rows: Vec::new(),
        }
    }

    /// Right-aligns the named columns.
    pub fn numeric(mut self, columns: &[&str]) -> Self {
        self.right = columns
            .iter()
            .filter_map(|c| self.headers.iter().position(|h| h == c))
            .collect();
        self
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn render(&self) -> String {
        let cols = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(cols) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        let mut line = |cells: &[String]| {
            let mut parts = Vec::with_capacity(cols);
            for (i, w) in widths.iter().enumerate() {
                let cell = cells.get(i).map_or("", String::as_str);
                let pad = w - cell.chars().count();
                if self.right.contains(&i) {
                    parts.push(format!("{}{cell}", " ".repeat(pad)));
                } else if i + 1 == cols {
                    parts.push(cell.to_owned());
                } else {
                    parts.push(format!("{cell}{}", " ".repeat(pad)));
                }
            }
            out.push_str(parts.join("  ").trim_end());
            out.push('\n');
        };
        line(&self.headers);
        for row in &self.rows {
            line(row);
        }
        out
    }
}

/// Writes `value` as pretty JSON with a trailing newline.
pub fn json<T: Serialize>(out: &mut dyn Write, value: &T) -> Result<(), CliError> {
    serde_json::to_writer_pretty(&mut *out, value)?;
    writeln!(out)?;
    Ok(())
}

/// `-` for empty cells, so columns stay readable.
pub fn or_dash(s: String) -> String {
    if s.is_empty() { "-".to_owned() } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_and_numbers_go_right() {
        let mut t = Table::new(&["NAME", "COUNT", "NOTE"]).numeric(&["COUNT"]);
        t.row(vec!["a".into(), "5".into(), "x".into()]);
        t.row(vec!["longer".into(), "12345".into(), String::new()]);
        assert_eq!(
            t.render(),
            "NAME    COUNT  NOTE\n\
             a           5  x\n\
             longer  12345\n"
        );
    }

    #[test]
    fn json_is_pretty_and_terminated() {
        let mut buf = Vec::new();
        json(&mut buf, &serde_json::json!({"a": 1})).unwrap();
        assert_eq!(String::from_utf8(buf).unwrap(), "{\n  \"a\": 1\n}\n");
    }
}
