//! The newest lines of a node's audit log, read backwards from the end of
//! the current file into the rotated ones, in bounded memory and time: the
//! console searches at most [`SCAN_BYTES`] per request (`fencer audit`
//! reads whole files for anything older).

use std::fs::File;
use std::io::{self, Read, Seek as _, SeekFrom};
use std::path::Path;

use crate::audit::{AuditRecord, audit_files};

/// Bytes of audit log one console search reads at most, newest first.
pub(crate) const SCAN_BYTES: u64 = 16 << 20;
/// Bytes read from a file at a time.
const CHUNK: u64 = 64 << 10;

/// What one search found.
#[derive(Debug)]
pub(super) struct Found {
    /// Matching lines, newest first.
    pub(super) lines: Vec<AuditRecord>,
    /// Bytes read.
    pub(super) scanned_bytes: u64,
    /// Whether the search reached the oldest line of the oldest file.
    pub(super) complete: bool,
}

/// The newest `limit` lines of the audit files in `dir` that `keep`
/// accepts, reading at most `budget` bytes. Lines that do not parse (a torn
/// last line) are skipped, as `fencer audit` skips them. Blocking file I/O.
pub(super) fn newest(
    dir: &Path,
    limit: usize,
    budget: u64,
    mut keep: impl FnMut(&AuditRecord) -> bool,
) -> io::Result<Found> {
    let mut found = Found { lines: Vec::new(), scanned_bytes: 0, complete: false };
    let files = match audit_files(dir) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    for path in files.iter().rev() {
        let mut file = match File::open(path) {
            Ok(f) => f,
            // Rotated away since it was listed: the next name holds it.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let mut pos = file.metadata()?.len();
        // The start of a line whose end was read already.
        let mut carry: Vec<u8> = Vec::new();
        while pos > 0 {
            if found.scanned_bytes >= budget {
                return Ok(found);
            }
            let start = pos.saturating_sub(CHUNK);
            let mut data = Vec::with_capacity((pos - start) as usize + carry.len());
            file.seek(SeekFrom::Start(start))?;
            Read::by_ref(&mut file).take(pos - start).read_to_end(&mut data)?;
            found.scanned_bytes += pos - start;
            data.extend_from_slice(&carry);
            // Unless this chunk starts the file, its first line may be cut:
            // it is kept for the next (earlier) chunk to complete.
            let (head, body): (&[u8], &[u8]) = match data.iter().position(|b| *b == b'\n') {
                _ if start == 0 => (&[], &data),
                Some(i) => (&data[..i], &data[i + 1..]),
                None => (&data, &[]),
            };
            for line in body.rsplit(|b| *b == b'\n') {
                if line.is_empty() {
                    continue;
                }
                if let Ok(r) = serde_json::from_slice::<AuditRecord>(line)
                    && keep(&r)
                {
                    found.lines.push(r);
                    if found.lines.len() == limit {
                        return Ok(found);
                    }
                }
            }
            carry = head.to_vec();
            pos = start;
        }
    }
    found.complete = true;
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::AUDIT_FILE;

    fn line(index: u64, resource: &str) -> String {
        format!(
            "{{\"log_index\":{index},\"part\":0,\"time\":\"2025-01-31T09:12:01.231Z\",\"op\":\"acquire\",\"outcome\":\"granted\",\"resource\":\"{resource}\",\"token\":{index},\"holder\":\"h\"}}\n"
        )
    }

    fn write(dir: &Path, name: &str, from: u64, to: u64) {
        let mut text = String::new();
        for i in from..to {
            text.push_str(&line(i, if i % 3 == 0 { "a/x" } else { "b/y" }));
        }
        std::fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn newest_first_across_rotated_files_and_chunks() {
        let dir = tempfile::tempdir().unwrap();
        // Enough lines that each file spans several chunks.
        write(dir.path(), &format!("{AUDIT_FILE}.1"), 1, 3000);
        write(dir.path(), AUDIT_FILE, 3000, 6000);
        let all = newest(dir.path(), usize::MAX, u64::MAX, |_| true).unwrap();
        assert!(all.complete);
        let indexes: Vec<u64> = all.lines.iter().map(|r| r.log_index).collect();
        assert_eq!(indexes, (1..6000).rev().collect::<Vec<_>>(), "every line once, newest first");

        let some = newest(dir.path(), 5, u64::MAX, |r| r.resource.as_deref() == Some("a/x")).unwrap();
        assert_eq!(some.lines.iter().map(|r| r.log_index).collect::<Vec<_>>(), vec![5997, 5994, 5991, 5988, 5985]);
        assert!(!some.complete);
    }

    #[test]
    fn the_budget_bounds_the_search() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), AUDIT_FILE, 1, 6000);
        let r = newest(dir.path(), usize::MAX, CHUNK, |_| true).unwrap();
        assert!(!r.complete);
        assert!(r.scanned_bytes <= CHUNK);
        assert!(!r.lines.is_empty() && r.lines[0].log_index == 5999);
    }

    #[test]
    fn a_torn_last_line_and_a_missing_dir_are_not_errors() {
        let dir = tempfile::tempdir().unwrap();
        let mut text = line(1, "a/x");
        text.push_str("{\"log_index\":2,\"par");
        std::fs::write(dir.path().join(AUDIT_FILE), text).unwrap();
        let r = newest(dir.path(), 10, u64::MAX, |_| true).unwrap();
        assert_eq!(r.lines.len(), 1);
        let missing = newest(&dir.path().join("nope"), 10, u64::MAX, |_| true).unwrap();
        assert!(missing.lines.is_empty() && missing.complete);
    }
}
