//! The one human table every view prints: every column has its heading; a column empty in every
//! row is left out; tables longer than [`TABLE_LIMIT`] rows show their first and last halves
//! with a line of their own saying how many rows were left out. Given a width, the columns
//! share it and long cells wrap, cut after a few lines unless they are to be shown in full.
//! Short cells (ids, dates, states, counts) never wrap: when the width cannot hold them whole
//! beside the long ones, the view's low-value columns are left out first, and a line under the
//! table names them.

use comfy_table::{ColumnConstraint, ContentArrangement, Row, Table, presets::UTF8_FULL_CONDENSED};

use super::out::{Fit, plural};

/// Rows of a human table beyond which only the first and last half of this are shown.
pub(crate) const TABLE_LIMIT: usize = 200;

/// A table being built: headings and rows of cells.
pub(crate) struct Grid {
    headings: Vec<&'static str>,
    rows: Vec<Vec<String>>,
    /// Rows added with [`Grid::row_at`] that will not be printed.
    left_out: usize,
    /// Which columns have content in a row left out.
    filled: Vec<bool>,
    /// Headings of the columns that may be left out when the width is short, first the one
    /// to leave out first.
    droppable: Vec<&'static str>,
}

/// Whether a cell counts as content (a column whose every cell is empty is left out).
pub(crate) fn has_content(cell: &str) -> bool {
    !cell.is_empty() && cell != "-"
}

impl Grid {
    pub(crate) fn new(headings: Vec<&'static str>) -> Self {
        let filled = vec![false; headings.len()];
        Self {
            headings,
            rows: Vec::new(),
            left_out: 0,
            filled,
            droppable: Vec::new(),
        }
    }

    /// The columns that may be left out when the width cannot hold the others' short cells
    /// whole, in the order to leave them out.
    pub(crate) fn droppable(mut self, order: &[&'static str]) -> Self {
        self.droppable = order.to_vec();
        self
    }

    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Adds row `index` of a table of `total` rows, formatting its `cells` only if it will be
    /// printed: a long table prints its first and last rows, and formatting the rest would
    /// cost more than reading them. For a row left out, `filled` says which of its cells have
    /// content, so that which columns are shown does not depend on which rows are.
    pub(crate) fn row_at(
        &mut self,
        index: usize,
        total: usize,
        cells: impl FnOnce() -> Vec<String>,
        filled: impl FnOnce() -> Vec<bool>,
    ) {
        let half = TABLE_LIMIT / 2;
        if total <= TABLE_LIMIT || index < half || index >= total - half {
            self.rows.push(cells());
        } else {
            self.left_out += 1;
            for (column, f) in self.filled.iter_mut().zip(filled()) {
                *column |= f;
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.rows.len() + self.left_out
    }

    /// The widest line of column `i`'s heading and of its cells in `rows`.
    fn column_width(&self, i: usize, rows: &[Vec<String>]) -> usize {
        std::iter::once(self.headings[i])
            .chain(rows.iter().map(|r| r.get(i).map_or("", String::as_str)))
            .flat_map(str::lines)
            .map(|l| l.chars().count())
            .max()
            .unwrap_or(0)
    }

    /// The table as text, columns that are empty in every row left out, fitted to `fit`.
    pub(crate) fn render(&self, fit: Fit) -> String {
        let mut keep: Vec<usize> = (0..self.headings.len())
            .filter(|&i| {
                self.filled[i]
                    || self
                        .rows
                        .iter()
                        .any(|r| r.get(i).is_some_and(|c| has_content(c)))
            })
            .collect();
        // Low-value columns go, one at a time, until the short columns fit whole.
        let mut dropped: Vec<&str> = Vec::new();
        if let Some(width) = fit.width {
            let mut order = self.droppable.iter();
            loop {
                let widths: Vec<usize> = keep
                    .iter()
                    .map(|&i| self.column_width(i, &self.rows))
                    .collect();
                let whole = whole_columns(&widths, usize::from(width));
                if widths
                    .iter()
                    .zip(&whole)
                    .all(|(w, whole)| *whole || *w > SHORT)
                {
                    break;
                }
                let Some(next) = order.find(|h| keep.iter().any(|&i| self.headings[i] == **h))
                else {
                    break;
                };
                keep.retain(|&i| self.headings[i] != *next);
                dropped.push(next);
            }
        }
        let table = |rows: &[Vec<String>]| {
            let mut t = Table::new();
            t.load_style(UTF8_FULL_CONDENSED);
            if let Some(width) = fit.width {
                t.set_content_arrangement(ContentArrangement::Dynamic);
                t.set_width(width);
            }
            t.set_header(keep.iter().map(|&i| self.headings[i]).collect::<Vec<_>>());
            for r in rows {
                let mut row = Row::from(
                    keep.iter()
                        .map(|&i| r.get(i).cloned().unwrap_or_default())
                        .collect::<Vec<_>>(),
                );
                if fit.width.is_some() && !fit.full {
                    row.max_height(Fit::CELL_LINES);
                }
                t.add_row(row);
            }
            if let Some(width) = fit.width {
                let widths: Vec<usize> = keep.iter().map(|&i| self.column_width(i, rows)).collect();
                for (c, whole) in whole_columns(&widths, usize::from(width))
                    .into_iter()
                    .enumerate()
                {
                    if let (true, Some(column)) = (whole, t.column_mut(c)) {
                        column.set_constraint(ColumnConstraint::ContentWidth);
                    }
                }
            }
            t.to_string()
        };
        let note = if dropped.is_empty() {
            String::new()
        } else {
            let text = format!(
                "(left out for the width: {}; --output json has every column)",
                dropped.join(", ")
            );
            let width = fit.width.map_or(usize::MAX, usize::from);
            format!("\n{}", super::out::wrap(&text, width))
        };
        if self.len() <= TABLE_LIMIT {
            return format!("{}{note}", table(&self.rows));
        }
        let half = TABLE_LIMIT / 2;
        let left_out = self.len() - TABLE_LIMIT;
        format!(
            "{}\n… {} left out; --output json lists every row\n{}{note}",
            table(&self.rows[..half]),
            plural(i64::try_from(left_out).unwrap_or(i64::MAX), "row", "rows"),
            table(&self.rows[self.rows.len() - half..])
        )
    }
}

/// Characters a wrapped column keeps at least.
const NARROWEST: usize = 10;

/// The widest a column of short cells is (ids, dates, timestamps, states, counts): such a
/// column never wraps while the view has a column it may leave out instead.
const SHORT: usize = 24;

/// Which columns keep their content's width when a table of columns `widths` wide must fit in
/// `width`: the narrow ones (dates, states, counts), so that only the widest (errors, reasons)
/// wrap, each keeping at least [`NARROWEST`] characters. None when even that does not fit:
/// then every column shares the width.
fn whole_columns(widths: &[usize], width: usize) -> Vec<bool> {
    // Each column takes its content, a space either side and a border; the table a last border.
    let frame = 3 * widths.len() + 1;
    let mut whole = vec![true; widths.len()];
    let mut by_width: Vec<usize> = (0..widths.len()).collect();
    by_width.sort_by_key(|&c| std::cmp::Reverse(widths[c]));
    for &c in &by_width {
        let kept: usize = (0..widths.len())
            .filter(|&k| whole[k])
            .map(|k| widths[k])
            .sum();
        let wrapped = whole.iter().filter(|w| !**w).count();
        if frame + kept + NARROWEST * wrapped <= width {
            return whole;
        }
        whole[c] = false;
    }
    vec![false; widths.len()]
}

/// A duration in milliseconds as a cell: `1.50s`.
pub(crate) fn duration_ms(ms: Option<i64>) -> String {
    ms.map(|ms| format!("{:.2}s", ms as f64 / 1000.0))
        .unwrap_or_default()
}

/// A value as a cell, empty when there is none.
pub(crate) fn or_empty<T: ToString>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_default()
}

/// A run's rows as a cell: those it published, else those its rejected tries computed, marked
/// as such (`5 rejected`).
pub(crate) fn rows_cell(published: Option<i64>, rejected: Option<i64>) -> String {
    match (published, rejected) {
        (Some(n), _) => n.to_string(),
        (None, Some(n)) => format!("{n} rejected"),
        (None, None) => String::new(),
    }
}

/// A run's error as a cell: empty when it only says the gate's reasons again (a rejection's
/// error is `task `T` rejected: REASONS`), which have their own column, beside a state that says
/// `rejected`.
pub(crate) fn error_cell(error: Option<&str>, reasons: Option<&str>) -> String {
    let Some(error) = error else {
        return String::new();
    };
    let says_reasons = reasons
        .filter(|r| !r.is_empty())
        .and_then(|r| error.strip_suffix(r))
        .is_some_and(|e| e.starts_with("task `") && e.ends_with("` rejected: "));
    if says_reasons {
        String::new()
    } else {
        error.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rejection_shows_its_rows_and_its_reasons_once() {
        assert_eq!(rows_cell(Some(10), None), "10");
        assert_eq!(rows_cell(None, Some(5)), "5 rejected");
        assert_eq!(rows_cell(None, None), "");
        let why = "row count 5 differs from the source count 10";
        let error = format!("task `export` rejected: {why}");
        assert_eq!(error_cell(Some(&error), Some(why)), "");
        assert_eq!(
            error_cell(Some("task `export` failed: no earlier version"), Some(why)),
            "task `export` failed: no earlier version"
        );
        assert_eq!(error_cell(Some("exit code 2"), Some(why)), "exit code 2");
        assert_eq!(error_cell(Some("exit code 2"), None), "exit code 2");
        assert_eq!(error_cell(None, Some(why)), "");
    }

    #[test]
    fn empty_columns_are_left_out_and_long_tables_say_what_they_skip() {
        let mut g = Grid::new(vec!["a", "empty", "b"]);
        for i in 0..3 {
            g.row(vec![i.to_string(), String::new(), "-".repeat(i)]);
        }
        let text = g.render(Fit::default());
        assert!(!text.contains("empty"), "{text}");
        assert!(text.contains(" b "), "{text}");
        let mut long = Grid::new(vec!["n"]);
        for i in 0..250 {
            long.row(vec![i.to_string()]);
        }
        let text = long.render(Fit::default());
        assert!(text.contains("\n… 50 rows left out; --output json lists every row\n"));
        assert!(text.contains(" 99 ") && text.contains(" 150 ") && !text.contains(" 120 "));
    }

    #[test]
    fn rows_left_out_are_not_formatted_but_still_decide_the_columns() {
        let cells = |i: usize| {
            vec![
                i.to_string(),
                if i == 120 { "x".into() } else { String::new() },
            ]
        };
        let mut eager = Grid::new(vec!["n", "rare"]);
        let mut lazy = Grid::new(vec!["n", "rare"]);
        let mut formatted = 0;
        for i in 0..250 {
            eager.row(cells(i));
            lazy.row_at(
                i,
                250,
                || {
                    formatted += 1;
                    cells(i)
                },
                || vec![true, i == 120],
            );
        }
        assert_eq!(formatted, TABLE_LIMIT);
        assert_eq!(lazy.len(), 250);
        assert_eq!(lazy.render(Fit::default()), eager.render(Fit::default()));
        assert!(
            lazy.render(Fit::default()).contains("rare"),
            "row 120 fills the column"
        );
    }

    fn wide() -> Grid {
        let mut g = Grid::new(vec!["interval", "state", "error"]);
        g.row(vec![
            "2026-01-02".into(),
            "rejected".into(),
            "task `export` rejected: row count 5 differs from the source count 10 by 50.0% (tolerance 0.0%)".into(),
        ]);
        g.row(vec!["2026-01-03".into(), "succeeded".into(), String::new()]);
        g
    }

    #[test]
    fn a_width_wraps_long_cells_and_no_line_is_wider() {
        let width = |text: &str| text.lines().map(|l| l.chars().count()).max().unwrap_or(0);
        let free = wide().render(Fit::default());
        assert!(width(&free) > 60, "{free}");
        let fitted = wide().render(Fit {
            width: Some(60),
            full: true,
        });
        assert!(width(&fitted) <= 60, "{fitted}");
        let words = |t: &str| {
            t.split(|c: char| c.is_whitespace() || "│┆".contains(c))
                .filter(|w| !w.is_empty())
                .count()
        };
        assert!(fitted.contains("0.0%)"), "in full: {fitted}");
        let cut = wide().render(Fit {
            width: Some(60),
            full: false,
        });
        assert!(width(&cut) <= 60, "{cut}");
        assert!(cut.contains('…') && !cut.contains("0.0%)"), "{cut}");
        assert!(words(&cut) < words(&fitted));
    }

    #[test]
    fn only_the_widest_columns_wrap() {
        // The runs of a DAG: dates, numbers and a timestamp stay whole; verdict and error wrap.
        let runs = [10, 3, 8, 9, 20, 8, 5, 4, 80, 94];
        let whole = whole_columns(&runs, 120);
        assert_eq!(
            whole,
            [true, true, true, true, true, true, true, true, false, false]
        );
        assert_eq!(whole_columns(&runs, 400), [true; 10], "it fits");
        assert_eq!(
            whole_columns(&runs, 40),
            [false; 10],
            "nothing fits: all share"
        );
    }

    #[test]
    fn a_table_that_fits_is_the_same_with_or_without_a_width() {
        let mut g = Grid::new(vec!["a", "b"]);
        g.row(vec!["one".into(), "two words".into()]);
        let fit = Fit {
            width: Some(120),
            full: false,
        };
        assert_eq!(g.render(fit), g.render(Fit::default()));
    }
}
