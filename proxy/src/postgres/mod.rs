//! What the PostgreSQL front end (DESIGN §4a) needs to read from the wire
//! protocol's text: `sql` splits a simple Query into statements and
//! recognises the few shapes the sidecar acts on (G2, G3, G8); `options`
//! reads the startup packet's `options` parameter (`-c fencer.token=N`).
//! Both are pure functions over borrowed text: no I/O, no async.

pub(crate) mod options;
pub(crate) mod sql;
