//! How commands print results: data on stdout (a table for humans or one JSON
//! object for scripts), logs and errors on stderr.
//!
//! Every write to stdout goes through [`outln!`] / [`out!`] (or checks
//! [`is_broken_pipe`]): when the reader is gone (`fencer audit | head -1`)
//! the command exits at once and quietly with [`exit::CLOSED_PIPE`], as Unix
//! tools do, never with a panic or an error message.

use std::io::Write as _;

use crate::exit;

/// `println!` to stdout, exiting quietly when the reader is gone.
macro_rules! outln {
    ($($arg:tt)*) => { $crate::output::write_stdout(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `print!` to stdout, exiting quietly when the reader is gone.
macro_rules! out {
    ($($arg:tt)*) => { $crate::output::write_stdout(format_args!($($arg)*)) };
}
pub(crate) use {out, outln};

/// Writes to stdout (and flushes); a closed pipe ends the process quietly,
/// any other failure with a message (exit 1).
pub(crate) fn write_stdout(args: std::fmt::Arguments<'_>) {
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        exit_on_write_error(&e);
    }
}

/// Ends the process after a failed write to stdout: quietly with
/// [`exit::CLOSED_PIPE`] for a closed pipe, else with a message.
pub(crate) fn exit_on_write_error(e: &std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(i32::from(exit::CLOSED_PIPE));
    }
    eprintln!("fencer: cannot write to stdout: {e}");
    std::process::exit(i32::from(exit::ERROR));
}

/// Whether `e` (or anything in its chain) is a write to a closed pipe.
pub(crate) fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            || c.downcast_ref::<serde_json::Error>()
                .is_some_and(|j| j.io_error_kind() == Some(std::io::ErrorKind::BrokenPipe))
    })
}

use serde::Serialize;

/// `-o table|json`, mirrored by `FENCER_OUTPUT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub(crate) enum OutputFormat {
    /// Aligned, human-readable text.
    #[default]
    Table,
    /// One JSON object on stdout.
    Json,
}

/// Prints `value` as one line of JSON on stdout.
pub(crate) fn print_json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    outln!("{}", serde_json::to_string(value)?);
    Ok(())
}

/// Prints rows as an aligned table with a header line.
pub(crate) fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            }
        }
        outln!("{}", out.trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}
