//! Fuzz checks (feature `fuzzing`), as in `fencer_proxy::fuzzing`: each
//! takes arbitrary bytes, never panics on any input but a broken promise,
//! and is run by a cargo-fuzz target in `fuzz/` (docs/security.md,
//! "Fuzzing") and by a bounded proptest on every `cargo test`.
//!
//! - [`snapshot_body`]: a snapshot body decoded as it is read (from a
//!   leader, or a node's own snapshot file) against the whole-body decode.

/// The first byte picks the read buffer (1–256 bytes), the second the size
/// of the pieces the body arrives in (1–256); the rest is the body. Panics
/// when the streamed decode and the whole-body decode disagree: a state
/// one accepts and the other refuses, or two different states.
pub fn snapshot_body(data: &[u8]) {
    let (buffer, piece, body) = match data {
        [b, p, body @ ..] => (usize::from(*b) + 1, usize::from(*p) + 1, body),
        _ => return,
    };
    if let Err(e) = crate::store::check_against_whole(body, &[piece], buffer) {
        panic!("{e} ({} bytes, buffer {buffer}, pieces of {piece})", body.len());
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use crate::golden::{GOLDEN_SNAPSHOT_BODY, GOLDEN_SNAPSHOT_BODY_DEDUP_V2, unhex};

    proptest! {
        /// The buffer and piece bytes, then a body: random bytes (both
        /// decodes refuse almost all of them before any row), or the
        /// format-4 tag and random bytes (which reach the row decoder).
        /// Edited golden bodies: `store::stream`'s property test.
        #[test]
        fn snapshot_body_holds_for_any_bytes(
            params in any::<[u8; 2]>(),
            tagged in any::<bool>(),
            rest in prop::collection::vec(any::<u8>(), 0..256),
        ) {
            let tag = if tagged { unhex(GOLDEN_SNAPSHOT_BODY)[..9].to_vec() } else { Vec::new() };
            super::snapshot_body(&[&params[..], &tag, &rest].concat());
        }
    }

    #[test]
    fn snapshot_body_holds_for_the_seeds() {
        for (buffer, piece) in [(0, 0), (7, 3), (255, 255)] {
            for body in [GOLDEN_SNAPSHOT_BODY, GOLDEN_SNAPSHOT_BODY_DEDUP_V2] {
                super::snapshot_body(&[&[buffer, piece][..], &unhex(body)].concat());
            }
        }
    }

    /// Writes the golden snapshot bodies as seeds of the `snapshot_body`
    /// target: `cargo test -p fencer-coordinator write_fuzz_seeds -- --ignored`.
    #[test]
    #[ignore = "writes fuzz/seeds; run by hand"]
    fn write_fuzz_seeds() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/snapshot_body");
        std::fs::create_dir_all(&dir).unwrap();
        for (name, body) in [("golden-v1", GOLDEN_SNAPSHOT_BODY), ("golden-v2", GOLDEN_SNAPSHOT_BODY_DEDUP_V2)] {
            std::fs::write(dir.join(name), [&[31, 63][..], &unhex(body)].concat()).unwrap();
        }
    }
}
