//! The process's allocator: mimalloc, and how promptly a coordinator gives
//! freed memory back to the system.
//!
//! mimalloc keeps the pages a thread has freed for a while before it
//! returns them (its purge delay, 1,000 ms by default), in case they are
//! wanted again. A follower frees its whole state when it installs a
//! snapshot, on another thread than the one that decodes the new state, and
//! with the default delay that memory was still held while it decoded the
//! new state and then applied the log behind it: the follower peaked
//! 24–41 MB higher than with the delay at 0, for no CPU difference beyond
//! the runs' spread (docs/performance.md, "The allocator's purge delay at 0
//! for coordinators"). So a coordinator runs with the delay at 0 unless its
//! environment names one.
//!
//! mimalloc reads its options from the environment when the process loads,
//! before `main`, and setting one afterwards takes its C API, which the
//! workspace's `unsafe_code = "forbid"` rules out. A coordinator started
//! without `MIMALLOC_PURGE_DELAY` therefore replaces itself, before it does
//! anything else, with the same program, arguments, name and process id and
//! the variable set to 0 ([`purge_freed_memory_at_once`]).

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// mimalloc instead of glibc malloc: under a coordinator's many-threaded load
/// glibc's per-thread arenas fragmented to 2-4x the live heap (fencer bench:
/// 400 MB RSS for a 100 MB heap); mimalloc returns freed memory promptly.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The variable mimalloc reads its purge delay from, in milliseconds (`-1`:
/// never purge).
pub(crate) const PURGE_DELAY_VAR: &str = "MIMALLOC_PURGE_DELAY";

/// The same option's older name, which mimalloc still reads.
const PURGE_DELAY_LEGACY_VAR: &str = "MIMALLOC_RESET_DELAY";

/// What [`purge_freed_memory_at_once`] found.
#[derive(Debug)]
pub(crate) enum PurgeDelay {
    /// The environment names a purge delay: the operator's, or the one this
    /// process set before it replaced itself. Its value, as written.
    Set(OsString),
    /// The process could not replace itself; mimalloc keeps its default.
    Default(std::io::Error),
}

/// Makes sure mimalloc runs with a purge delay the environment names: when
/// neither `MIMALLOC_PURGE_DELAY` nor its older name is set, replaces this
/// process (`execve`, same process id, arguments and open files) with the
/// same program and `MIMALLOC_PURGE_DELAY=0`, and does not return. Call it
/// first thing in `main`, while the process has nothing open worth keeping.
/// Returns what was found, or why the process could not be replaced.
///
/// The program is executed by its path (what `/proc/self/exe` names), not
/// through `/proc/self/exe` itself: the kernel names a process after the
/// file it executes, and `ps`, `pgrep fencer` and `top` must still see
/// `fencer`, not `exe`. A binary removed since the process started (an
/// upgrade in place) leaves no path to execute: the process then runs on
/// with mimalloc's default.
pub(crate) fn purge_freed_memory_at_once() -> PurgeDelay {
    if let Some(set) = std::env::var_os(PURGE_DELAY_VAR).or_else(|| std::env::var_os(PURGE_DELAY_LEGACY_VAR)) {
        return PurgeDelay::Set(set);
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return PurgeDelay::Default(e),
    };
    let mut args = std::env::args_os();
    let mut cmd = Command::new(exe);
    if let Some(arg0) = args.next() {
        cmd.arg0(arg0);
    }
    // `exec` returns only if it failed.
    let failed = cmd.args(args).env(PURGE_DELAY_VAR, "0").exec();
    PurgeDelay::Default(failed)
}
