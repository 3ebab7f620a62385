//! What the PostgreSQL front end (DESIGN §4a) needs to read from the wire
//! protocol's text: `sql` splits a simple Query into statements and
//! recognises the few shapes the sidecar acts on (G2, G3, G8).
//! Pure functions over borrowed text: no I/O, no async.

pub(crate) mod sql;
