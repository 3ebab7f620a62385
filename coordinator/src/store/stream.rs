//! Decoding a format-4 snapshot body as it is read (issue 18): each row goes
//! straight into the lock state being built, so installing a snapshot or
//! opening a data dir holds neither the ~30 MB body nor its ~500,000 rows
//! (at the seed state) in memory, only the state itself and a buffer.
//!
//! The body is the postcard encoding of `(tag, TableDump)` (module
//! `snapshot`): the tag, then four tables, each a length and that many
//! `(key, encoded value)` rows. A body whose first value is not the tag is
//! not format 4, and the caller decodes it whole the older ways.

use std::fmt;
use std::io::{self, Read};
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{DeserializeSeed, SeqAccess, Visitor};

use super::snapshot::FORMAT_4_TAG;
use super::tables::StateRows;
use crate::state_machine::LockState;

/// Bytes read from the body at a time; a value longer than this (none is,
/// at today's limits) grows the buffer to its length.
const READ_BUFFER: usize = 256 << 10;

/// A body decoded as it is read: its state, or that it is not format 4.
pub(super) enum Streamed {
    State(LockState),
    NotFormat4,
}

/// Decodes the `len`-byte body that `reader` yields as a format-4 body,
/// row by row (module docs). Every byte must be used, and the reader must
/// yield exactly `len`; an error says what was wrong with which row or
/// read. Blocking when the reader is.
pub(super) fn state_from_body(reader: impl Read, len: u64) -> io::Result<Streamed> {
    decode_with(reader, len, READ_BUFFER)
}

/// [`state_from_body`], reading `buffer` bytes at a time.
fn decode_with(reader: impl Read, len: u64, buffer: usize) -> io::Result<Streamed> {
    let mut source = Source::new(reader, len, buffer);
    let mut refused = None;
    let decoded = decode_body(&mut postcard::Deserializer::from_flavor(&mut source), &mut refused);
    match decoded {
        Ok(None) => match source.failure {
            // Not read, rather than not format 4.
            Some(e) => Err(e),
            None => Ok(Streamed::NotFormat4),
        },
        Ok(Some(rows)) => {
            let left = source.left();
            if left > 0 {
                return Err(invalid(format!("decode snapshot: {left} bytes left over ({len} bytes)")));
            }
            Ok(Streamed::State(rows.finish()))
        }
        // A row that was read but is not valid, or a read error, says so
        // itself; postcard's error says only what was malformed.
        Err(e) => {
            let at = len - source.left();
            Err(refused
                .or(source.failure)
                .unwrap_or_else(|| invalid(format!("decode snapshot: {e} (at byte {at} of {len})"))))
        }
    }
}

/// The tag, then the four tables into one [`StateRows`]; `None` when the
/// body does not start with the tag. A row that [`StateRows`] refuses ends the
/// decode with its error in `refused` (postcard's errors carry no text).
fn decode_body<'s, R: Read>(
    de: &mut postcard::Deserializer<'s, &'s mut Source<R>>,
    refused: &mut Option<io::Error>,
) -> postcard::Result<Option<StateRows>> {
    // Not even a number: not format 4 either; the older decodes say why.
    if u64::deserialize(&mut *de).ok() != Some(FORMAT_4_TAG) {
        return Ok(None);
    }
    let mut rows = StateRows::default();
    Table::<String, _>::new(refused, |k, v| rows.resource(&k, v)).deserialize(&mut *de)?;
    Table::<u128, _>::new(refused, |k, v| rows.dedup(k, v)).deserialize(&mut *de)?;
    Table::<u128, _>::new(refused, |k, v| rows.ended(k, v)).deserialize(&mut *de)?;
    Table::<String, _>::new(refused, |k, v| rows.signing_key(&k, v)).deserialize(&mut *de)?;
    Ok(Some(rows))
}

fn invalid(text: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, text)
}

/// One table: a sequence of `(key, encoded value)` rows, each handed to
/// `row` as it is read. A row that `row` refuses ends the decode, its error
/// kept in `refused`.
struct Table<'r, K, F> {
    row: F,
    refused: &'r mut Option<io::Error>,
    key: PhantomData<K>,
}

impl<'r, K, F: FnMut(K, &[u8]) -> io::Result<()>> Table<'r, K, F> {
    fn new(refused: &'r mut Option<io::Error>, row: F) -> Self {
        Self { row, refused, key: PhantomData }
    }
}

impl<'de, K, F> DeserializeSeed<'de> for Table<'_, K, F>
where
    K: Deserialize<'de>,
    F: FnMut(K, &[u8]) -> io::Result<()>,
{
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        de.deserialize_seq(self)
    }
}

impl<'de, K, F> Visitor<'de> for Table<'_, K, F>
where
    K: Deserialize<'de>,
    F: FnMut(K, &[u8]) -> io::Result<()>,
{
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a table of (key, value) rows")
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        while let Some((key, Value(value))) = seq.next_element::<(K, Value)>()? {
            if let Err(e) = (self.row)(key, &value) {
                *self.refused = Some(e);
                return Err(serde::de::Error::custom("a row was refused"));
            }
        }
        Ok(())
    }
}

/// A row's encoded value: postcard writes a `Vec<u8>` as its length and its
/// bytes, which is how it reads a byte buffer (one copy, not a push per byte).
struct Value(Vec<u8>);

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: serde::Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        struct Bytes;
        impl Visitor<'_> for Bytes {
            type Value = Value;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an encoded value")
            }
            fn visit_bytes<E>(self, v: &[u8]) -> Result<Value, E> {
                Ok(Value(v.to_vec()))
            }
            fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<Value, E> {
                Ok(Value(v))
            }
        }
        de.deserialize_byte_buf(Bytes)
    }
}

/// The body's bytes for postcard: read `READ_BUFFER` at a time, never
/// past the body's length, and handed out from the buffer (postcard's own
/// reader flavor keeps every byte it hands out, the whole body by the end).
struct Source<R> {
    reader: R,
    /// Bytes read at a time (more only for a longer value).
    buffer: usize,
    buf: Vec<u8>,
    /// `buf[pos..filled]` is read and not yet used.
    pos: usize,
    filled: usize,
    /// Bytes of the body not yet read from `reader`.
    unread: u64,
    /// A read error, with what it was reading.
    failure: Option<io::Error>,
}

impl<R: Read> Source<R> {
    fn new(reader: R, len: u64, buffer: usize) -> Self {
        Self { reader, buffer, buf: Vec::new(), pos: 0, filled: 0, unread: len, failure: None }
    }

    /// Bytes of the body not used yet.
    fn left(&self) -> u64 {
        (self.filled - self.pos) as u64 + self.unread
    }

    /// Makes `n` unused bytes ready in the buffer; an error when the body
    /// has fewer left (a length that runs past the body, whatever its
    /// value, allocates nothing) or a read fails.
    fn ready(&mut self, n: usize) -> postcard::Result<()> {
        if self.filled - self.pos >= n {
            return Ok(());
        }
        if n as u64 > self.left() {
            return Err(postcard::Error::DeserializeUnexpectedEnd);
        }
        self.buf.copy_within(self.pos..self.filled, 0);
        self.filled -= self.pos;
        self.pos = 0;
        let size = n.max(self.buffer).min(usize::try_from(self.left()).unwrap_or(usize::MAX));
        if self.buf.len() < size {
            self.buf.resize(size, 0);
        }
        while self.filled < n {
            let want = (self.buf.len() - self.filled).min(usize::try_from(self.unread).unwrap_or(usize::MAX));
            match self.reader.read(&mut self.buf[self.filled..self.filled + want]) {
                Ok(0) => {
                    let short = format!("the body ended {} bytes short of its length", self.unread);
                    self.failure = Some(io::Error::new(io::ErrorKind::UnexpectedEof, short));
                    return Err(postcard::Error::DeserializeUnexpectedEnd);
                }
                Ok(got) => {
                    self.filled += got;
                    self.unread -= got as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.failure = Some(e);
                    return Err(postcard::Error::DeserializeUnexpectedEnd);
                }
            }
        }
        Ok(())
    }
}

impl<'de, 's: 'de, R: Read + 'de> postcard::de_flavors::Flavor<'de> for &'s mut Source<R> {
    type Remainder = ();
    type Source = ();

    fn pop(&mut self) -> postcard::Result<u8> {
        self.ready(1)?;
        self.pos += 1;
        Ok(self.buf[self.pos - 1])
    }

    fn size_hint(&self) -> Option<usize> {
        usize::try_from(self.left()).ok()
    }

    /// Borrowing from the body is not possible (its bytes do not outlive
    /// the buffer); the types decoded here never ask for it.
    fn try_take_n(&mut self, _: usize) -> postcard::Result<&'de [u8]> {
        Err(postcard::Error::DeserializeBadEncoding)
    }

    fn try_take_n_temp<'a>(&'a mut self, n: usize) -> postcard::Result<&'a [u8]>
    where
        'de: 'a,
    {
        self.ready(n)?;
        self.pos += n;
        Ok(&self.buf[self.pos - n..self.pos])
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// Decodes `body` as it would be read in pieces of the `pieces` sizes (in
/// turn) through a `buffer`-byte buffer, and checks the result against the
/// whole-body decode ([`TableDump`] and [`state_from_dump`]): the same
/// state, or both refuse it. Says how they differ. For the property test
/// below and the fuzz target (`fencer_coordinator::fuzzing`).
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn check_against_whole(body: &[u8], pieces: &[usize], buffer: usize) -> Result<(), String> {
    let reader = Pieces { bytes: body, sizes: pieces.to_vec(), next: 0 };
    let streamed = decode_with(reader, body.len() as u64, buffer.max(1));
    let tagged = postcard::take_from_bytes::<u64>(body).is_ok_and(|(tag, _)| tag == FORMAT_4_TAG);
    if tagged && matches!(streamed, Ok(Streamed::NotFormat4)) {
        return Err("a body that starts with the tag is said not to be format 4".into());
    }
    match (streamed, whole(body)) {
        (Ok(Streamed::State(a)), Some(b)) if a == b => Ok(()),
        (Ok(Streamed::State(_)), Some(_)) => Err("the two decodes give different states".into()),
        (Ok(Streamed::State(_)), None) => Err("only the streamed decode accepts the body".into()),
        (Ok(Streamed::NotFormat4) | Err(_), Some(_)) => Err("only the whole-body decode accepts the body".into()),
        (Ok(Streamed::NotFormat4) | Err(_), None) => Ok(()),
    }
}

/// The whole-body decode of a format-4 body: `None` for any error.
#[cfg(any(test, feature = "fuzzing"))]
fn whole(body: &[u8]) -> Option<LockState> {
    use super::tables::{TableDump, state_from_dump};
    let (tag, rest) = postcard::take_from_bytes::<u64>(body).ok()?;
    let (dump, rest) = postcard::take_from_bytes::<TableDump>(rest).ok()?;
    (tag == FORMAT_4_TAG && rest.is_empty()).then(|| state_from_dump(&dump).ok()).flatten()
}

/// Yields its bytes in pieces of the sizes given (in turn, each at least 1).
#[cfg(any(test, feature = "fuzzing"))]
struct Pieces<'a> {
    bytes: &'a [u8],
    sizes: Vec<usize>,
    next: usize,
}

#[cfg(any(test, feature = "fuzzing"))]
impl Read for Pieces<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let size = self.sizes.get(self.next % self.sizes.len().max(1)).copied().unwrap_or(usize::MAX).max(1);
        self.next += 1;
        let n = size.min(buf.len()).min(self.bytes.len());
        buf[..n].copy_from_slice(&self.bytes[..n]);
        self.bytes = &self.bytes[n..];
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    //! The streamed decode against the whole-body one ([`TableDump`] and
    //! [`state_from_dump`]): the same state or both an error, for any
    //! bytes, read in any pieces through any buffer.

    use proptest::prelude::*;

    use super::*;
    use crate::golden::{GOLDEN_SNAPSHOT_BODY, GOLDEN_SNAPSHOT_BODY_DEDUP_V2, unhex};
    use crate::store::tables::TableDump;

    fn streamed(body: &[u8], pieces: &[usize], buffer: usize) -> io::Result<Streamed> {
        decode_with(Pieces { bytes: body, sizes: pieces.to_vec(), next: 0 }, body.len() as u64, buffer)
    }

    fn goldens() -> [Vec<u8>; 2] {
        [unhex(GOLDEN_SNAPSHOT_BODY), unhex(GOLDEN_SNAPSHOT_BODY_DEDUP_V2)]
    }

    /// A golden body, or one with bytes changed, cut, inserted or removed.
    fn bodies() -> impl Strategy<Value = Vec<u8>> {
        let edited = (0..2usize, prop::collection::vec((any::<prop::sample::Index>(), 0..4u8, any::<u8>()), 0..4))
            .prop_map(|(which, edits)| {
                let mut body = goldens()[which].clone();
                for (at, how, byte) in edits {
                    let i = at.index(body.len() + 1);
                    match how {
                        0 if i < body.len() => body[i] = byte,
                        1 => body.truncate(i),
                        2 => body.insert(i, byte),
                        _ if i < body.len() => drop(body.remove(i)),
                        _ => {}
                    }
                }
                body
            });
        let tagged = prop::collection::vec(any::<u8>(), 0..64).prop_map(|rest| {
            let mut body = postcard::to_stdvec(&FORMAT_4_TAG).unwrap();
            body.extend(rest);
            body
        });
        prop_oneof![4 => edited, 1 => tagged, 1 => prop::collection::vec(any::<u8>(), 0..64)]
    }

    proptest! {
        #[test]
        fn the_streamed_decode_is_the_whole_body_decode(
            body in bodies(),
            pieces in prop::collection::vec(1..40usize, 1..8),
            buffer in 1..64usize,
        ) {
            if let Err(e) = check_against_whole(&body, &pieces, buffer) {
                prop_assert!(false, "{}", e);
            }
        }
    }

    #[test]
    fn a_golden_body_decodes_to_its_dump_whatever_the_buffer() {
        for body in goldens() {
            let expected = whole(&body).expect("a golden body decodes");
            assert!(!expected.dedup_records().is_empty() && !expected.signing_keys().is_empty());
            for buffer in [1, 2, 7, 256 << 10] {
                let Streamed::State(state) = streamed(&body, &[usize::MAX], buffer).unwrap() else {
                    panic!("a golden body is format 4")
                };
                assert_eq!(state, expected, "buffer {buffer}");
            }
        }
    }

    #[test]
    fn a_body_that_does_not_start_with_the_tag_is_not_format_4() {
        let format_3 = postcard::to_stdvec(&(0u8, 0u8, 0u8, 0u8)).unwrap();
        assert!(matches!(streamed(&format_3, &[9], 8).unwrap(), Streamed::NotFormat4));
        assert!(matches!(streamed(&[], &[9], 8).unwrap(), Streamed::NotFormat4), "an empty body");
        assert!(matches!(streamed(&[0xff; 3], &[9], 8).unwrap(), Streamed::NotFormat4), "not a number");
    }

    #[test]
    fn a_body_shorter_than_its_length_says_by_how_much() {
        let body = &goldens()[1];
        let cut = &body[..body.len() - 10];
        let e = decode_with(cut, body.len() as u64, 64).err().expect("a short body is refused");
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(e.to_string().contains("ended 10 bytes short"), "{e}");
    }

    #[test]
    fn a_read_error_is_the_error() {
        struct Failing;
        impl Read for Failing {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::new(io::ErrorKind::PermissionDenied, "read the snapshot body in /x: denied"))
            }
        }
        let e = decode_with(Failing, 100, 64).err().expect("a read error is an error");
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("/x: denied"), "{e}");
    }

    #[test]
    fn a_refused_row_names_what_was_wrong_with_it() {
        let mut body = postcard::to_stdvec(&FORMAT_4_TAG).unwrap();
        let dump = TableDump { resources: vec![(String::new(), vec![0])], ..TableDump::default() };
        body.extend(postcard::to_stdvec(&dump).unwrap());
        let e = streamed(&body, &[3], 16).err().expect("an empty resource name is refused");
        assert!(e.to_string().contains("stored resource name"), "{e}");
    }

    #[test]
    fn bytes_after_the_tables_are_refused() {
        let mut body = goldens()[1].clone();
        body.extend([0, 0]);
        let e = streamed(&body, &[100], 32).err().expect("left-over bytes are refused");
        assert!(e.to_string().contains("2 bytes left over"), "{e}");
    }

    #[test]
    fn a_length_past_the_end_of_the_body_allocates_nothing() {
        let mut body = postcard::to_stdvec(&FORMAT_4_TAG).unwrap();
        // One resource whose name is said to be 2^60 bytes long.
        body.extend(postcard::to_stdvec(&(1u64, 1u64 << 60)).unwrap());
        let e = streamed(&body, &[100], 32).err().expect("a length past the end is refused");
        assert!(e.to_string().contains(&format!("of {}", body.len())), "{e}");
    }
}
