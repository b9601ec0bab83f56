//! One output layer for every read command (ADR-0122).
//!
//! A command returns a typed document (what `-o json` and `-o yaml` serialise, unchanged) and
//! describes it as a [`Listing`]: typed columns, one [`Row`] per record with its name, plus
//! optional lines above and below the table. [`render`] turns that into any
//! [`OutputFormat`]:
//!
//! * `table` — aligned columns with a header row; `wide` adds the wide-only columns;
//! * `json` / `yaml` — the document itself, one per snapshot;
//! * `name` — `kind/name` per record, for `xargs` and `while read`.
//!
//! `--no-headers` leaves only the data rows of `table` and `wide`. A new read command
//! (e.g. `machines`, `actions`) implements [`Render`] for its document and is done.

use std::io::Write;

use clap::ValueEnum;
use serde::Serialize;

use crate::error::CliError;

/// How results are printed (`-o`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Aligned columns for people.
    Table,
    /// The table with extra columns.
    Wide,
    /// One JSON document for tools.
    Json,
    /// One YAML document for tools.
    Yaml,
    /// `kind/name` per record, one a line.
    Name,
}

/// `-o` plus `--no-headers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputOptions {
    pub format: OutputFormat,
    /// Table and wide: data rows only (no header row, no summary or notice lines).
    pub no_headers: bool,
}

impl OutputOptions {
    pub fn new(format: OutputFormat) -> Self {
        Self {
            format,
            no_headers: false,
        }
    }
}

/// One column of a listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    pub header: &'static str,
    /// Right-aligned.
    pub numeric: bool,
    /// Shown only with `-o wide`.
    pub wide: bool,
}

impl Column {
    pub const fn text(header: &'static str) -> Self {
        Self {
            header,
            numeric: false,
            wide: false,
        }
    }

    pub const fn number(header: &'static str) -> Self {
        Self {
            header,
            numeric: true,
            wide: false,
        }
    }

    /// The same column, shown only with `-o wide`.
    pub const fn wide(self) -> Self {
        Self { wide: true, ..self }
    }
}

/// One record: its name (for `-o name`) and one cell per column, wide ones included.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub name: String,
    pub cells: Vec<String>,
}

/// The people's view of a document: typed columns, named rows, and lines around them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    /// The resource kind `-o name` prefixes (`shard`, `need`, ...).
    pub kind: &'static str,
    pub columns: Vec<Column>,
    pub rows: Vec<Row>,
    /// Lines above the table (a summary).
    pub preamble: Vec<String>,
    /// Printed instead of the table when there are no rows.
    pub empty: String,
    /// Lines below the table (notices about missing data).
    pub footer: Vec<String>,
}

impl Listing {
    pub fn new(kind: &'static str, columns: Vec<Column>) -> Self {
        Self {
            kind,
            columns,
            rows: Vec::new(),
            preamble: Vec::new(),
            empty: String::new(),
            footer: Vec::new(),
        }
    }

    /// The line shown when there is nothing to list.
    pub fn when_empty(mut self, message: impl Into<String>) -> Self {
        self.empty = message.into();
        self
    }

    /// Adds a record; `cells` holds one entry per column, in order.
    pub fn row(&mut self, name: impl Into<String>, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.columns.len(), "one cell per column");
        self.rows.push(Row {
            name: name.into(),
            cells,
        });
    }

    fn table(&self, wide: bool, no_headers: bool) -> String {
        let shown: Vec<usize> = (0..self.columns.len())
            .filter(|&i| wide || !self.columns[i].wide)
            .collect();
        let cell = |row: &[String], i: usize| row.get(i).map_or("", String::as_str).to_owned();
        let headers: Vec<String> = shown
            .iter()
            .map(|&i| self.columns[i].header.to_owned())
            .collect();
        let rows: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| shown.iter().map(|&i| cell(&r.cells, i)).collect())
            .collect();
        let numeric: Vec<bool> = shown.iter().map(|&i| self.columns[i].numeric).collect();
        let mut widths = vec![0; shown.len()];
        let all = (!no_headers).then_some(&headers).into_iter().chain(&rows);
        for r in all {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let mut out = String::new();
        let mut line = |cells: &[String]| {
            let mut text = String::new();
            for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
                if i > 0 {
                    text.push_str("  ");
                }
                let pad = " ".repeat(w - c.chars().count());
                if numeric[i] {
                    text.push_str(&pad);
                    text.push_str(c);
                } else {
                    text.push_str(c);
                    text.push_str(&pad);
                }
            }
            out.push_str(text.trim_end());
            out.push('\n');
        };
        if !no_headers {
            line(&headers);
        }
        for r in &rows {
            line(r);
        }
        out
    }

    fn text(&self, wide: bool, no_headers: bool) -> String {
        if no_headers {
            return self.table(wide, true);
        }
        let mut out = String::new();
        for l in &self.preamble {
            out.push_str(l);
            out.push('\n');
        }
        if self.rows.is_empty() {
            if !self.empty.is_empty() {
                out.push_str(&self.empty);
                out.push('\n');
            }
        } else {
            out.push_str(&self.table(wide, false));
        }
        for l in &self.footer {
            out.push_str(l);
            out.push('\n');
        }
        out
    }

    fn names(&self) -> String {
        self.rows
            .iter()
            .map(|r| format!("{}/{}\n", self.kind, r.name))
            .collect()
    }
}

/// A document every output format can show.
pub trait Render: Serialize {
    fn listing(&self) -> Listing;
}

/// The text of `value` in the requested format (always newline-terminated when not empty).
pub fn render<T: Render + ?Sized>(value: &T, opts: OutputOptions) -> Result<String, CliError> {
    Ok(match opts.format {
        OutputFormat::Table => value.listing().text(false, opts.no_headers),
        OutputFormat::Wide => value.listing().text(true, opts.no_headers),
        OutputFormat::Name => value.listing().names(),
        OutputFormat::Json => json_string(value)?,
        OutputFormat::Yaml => yaml_string(value)?,
    })
}

/// Pretty JSON with a trailing newline.
pub fn json_string<T: Serialize + ?Sized>(value: &T) -> Result<String, CliError> {
    let mut s = serde_json::to_string_pretty(value)?;
    s.push('\n');
    Ok(s)
}

/// YAML (block style, newline-terminated).
pub fn yaml_string<T: Serialize + ?Sized>(value: &T) -> Result<String, CliError> {
    serde_norway::to_string(value).map_err(|e| CliError::Yaml(e.to_string()))
}

/// Writes `value` as pretty JSON with a trailing newline.
pub fn json<T: Serialize>(out: &mut dyn Write, value: &T) -> Result<(), CliError> {
    out.write_all(json_string(value)?.as_bytes())?;
    Ok(())
}

/// Output of commands that are not listings (admin, pki): json and yaml serialise the
/// value; table, wide and name print its human text.
pub fn document<T: Serialize>(
    out: &mut dyn Write,
    format: OutputFormat,
    value: &T,
    human: impl FnOnce() -> String,
) -> Result<(), CliError> {
    let text = match format {
        OutputFormat::Json => json_string(value)?,
        OutputFormat::Yaml => yaml_string(value)?,
        OutputFormat::Table | OutputFormat::Wide | OutputFormat::Name => human(),
    };
    out.write_all(text.as_bytes())?;
    Ok(())
}

/// `-` for empty cells, so columns stay readable.
pub fn or_dash(s: String) -> String {
    if s.is_empty() { "-".to_owned() } else { s }
}

/// `cell()` when there is a value to show, else `-` (for values whose absence is a
/// condition, such as a zero timestamp, rather than an empty string).
pub fn dash_unless(present: bool, cell: impl FnOnce() -> String) -> String {
    if present { cell() } else { "-".to_owned() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Things(Vec<(String, u32, String)>);

    impl Render for Things {
        fn listing(&self) -> Listing {
            let mut l = Listing::new(
                "thing",
                vec![
                    Column::text("NAME"),
                    Column::number("COUNT"),
                    Column::text("NOTE"),
                    Column::text("EXTRA").wide(),
                ],
            )
            .when_empty("no things");
            l.preamble.push("2 things".into());
            for (n, c, note) in &self.0 {
                l.row(
                    n.clone(),
                    vec![n.clone(), c.to_string(), note.clone(), format!("x-{n}")],
                );
            }
            l
        }
    }

    fn things() -> Things {
        Things(vec![
            ("a".into(), 5, "x".into()),
            ("longer".into(), 12345, String::new()),
        ])
    }

    fn show(t: &Things, format: OutputFormat, no_headers: bool) -> String {
        render(t, OutputOptions { format, no_headers }).unwrap()
    }

    #[test]
    fn columns_align_and_numbers_go_right() {
        assert_eq!(
            show(&things(), OutputFormat::Table, false),
            "2 things\n\
             NAME    COUNT  NOTE\n\
             a           5  x\n\
             longer  12345\n"
        );
    }

    #[test]
    fn wide_adds_columns_and_no_headers_leaves_rows() {
        assert_eq!(
            show(&things(), OutputFormat::Wide, false),
            "2 things\n\
             NAME    COUNT  NOTE  EXTRA\n\
             a           5  x     x-a\n\
             longer  12345        x-longer\n"
        );
        // Widths come from the data alone once the header is gone.
        assert_eq!(
            show(&things(), OutputFormat::Table, true),
            "a           5  x\n\
             longer  12345\n"
        );
        assert_eq!(
            show(
                &Things(vec![("b".into(), 1, "n".into())]),
                OutputFormat::Table,
                true
            ),
            "b  1  n\n"
        );
    }

    #[test]
    fn names_and_empty_listings() {
        assert_eq!(
            show(&things(), OutputFormat::Name, false),
            "thing/a\nthing/longer\n"
        );
        let none = Things(vec![]);
        assert_eq!(
            show(&none, OutputFormat::Table, false),
            "2 things\nno things\n"
        );
        assert_eq!(show(&none, OutputFormat::Table, true), "");
        assert_eq!(show(&none, OutputFormat::Name, false), "");
    }

    #[test]
    fn json_and_yaml_serialise_the_document() {
        assert_eq!(
            show(&things(), OutputFormat::Json, false),
            "[\n  [\n    \"a\",\n    5,\n    \"x\"\n  ],\n  [\n    \"longer\",\n    12345,\n    \"\"\n  ]\n]\n"
        );
        assert_eq!(
            show(&things(), OutputFormat::Yaml, false),
            "- - a\n  - 5\n  - x\n- - longer\n  - 12345\n  - ''\n"
        );
    }
}
