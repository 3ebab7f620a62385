//! `fencer_coordinator::fuzzing::snapshot_body`: see coordinator/src/fuzzing.rs for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fencer_coordinator::fuzzing::snapshot_body(data));
