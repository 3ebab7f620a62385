//! `fencer_proxy::fuzzing::pg_frames`: see proxy/src/fuzzing.rs for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fencer_proxy::fuzzing::pg_frames(data));
