//! Encoding of everything fencer writes to disk or sends between nodes:
//! postcard (compact, serde-based), wrapped so failures become `io::Error`s
//! that name what could not be decoded.

use std::io;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Encodes `value` with postcard.
pub(crate) fn encode<T: Serialize + ?Sized>(value: &T) -> io::Result<Vec<u8>> {
    postcard::to_stdvec(value).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("encode: {e}")))
}

/// Decodes a postcard value; `what` names it in the error.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8], what: &str) -> io::Result<T> {
    postcard::from_bytes(bytes)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("decode {what}: {e} ({} bytes)", bytes.len())))
}

/// Turns any displayable storage error into an `io::Error`.
pub(crate) fn io_err(context: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("{context}: {e}"))
}
