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
//! the variable set to 0 ([`purge_freed_memory_at_once`]). It does so only
//! when it can run itself again as it was started; otherwise (started
//! through the dynamic loader or under valgrind, say) it keeps mimalloc's
//! default and says so in its log.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// mimalloc instead of glibc malloc: under a coordinator's many-threaded load
/// glibc's per-thread arenas fragmented to 2-4x the live heap (fencer bench:
/// 400 MB RSS for a 100 MB heap). How soon it gives freed pages back is its
/// purge delay, below.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The variable mimalloc reads its purge delay from, in milliseconds (`-1`:
/// never purge).
const PURGE_DELAY_VAR: &str = "MIMALLOC_PURGE_DELAY";

/// The same option's older name, which mimalloc still reads.
const PURGE_DELAY_LEGACY_VAR: &str = "MIMALLOC_RESET_DELAY";

/// The file this process runs, as the kernel knows it.
const SELF_EXE: &str = "/proc/self/exe";

/// What [`purge_freed_memory_at_once`] found.
#[derive(Debug)]
pub(crate) enum PurgeDelay {
    /// The environment names a purge delay: the operator's, or the one this
    /// process set before it replaced itself. The variable (as spelled in
    /// the environment: mimalloc ignores case) and its value.
    Set { var: OsString, value: OsString },
    /// The process did not replace itself, and why; mimalloc keeps its
    /// default.
    NotReplaced(String),
    /// Replacing the process failed; mimalloc keeps its default. The
    /// standard library reset SIGPIPE to its default action on the way
    /// (`Command::exec`); [`report`](Self::report) handles it again.
    Failed(std::io::Error),
}

impl PurgeDelay {
    /// Logs what was found (a warning when mimalloc keeps its default) and,
    /// after a failed exec, handles SIGPIPE again: at its default action a
    /// write to a closed pipe would end the process instead of failing
    /// with EPIPE. A tokio handler stays registered for the process's life.
    pub(crate) fn report(self, runtime: &tokio::runtime::Runtime) {
        let why = match self {
            Self::Set { var, value } => {
                tracing::debug!(purge_delay_ms = ?value, "allocator: purge delay from {}", var.to_string_lossy());
                return;
            }
            Self::NotReplaced(why) => format!("not restarted with {PURGE_DELAY_VAR}=0: {why}"),
            Self::Failed(e) => {
                let pipe = tokio::signal::unix::SignalKind::pipe();
                if let Err(e) = runtime.block_on(async { tokio::signal::unix::signal(pipe) }) {
                    tracing::warn!(error = %e, "cannot handle SIGPIPE after the failed restart");
                }
                format!("could not restart with {PURGE_DELAY_VAR}=0: {e}")
            }
        };
        tracing::warn!(
            "allocator: {why}; freed memory goes back to the system after mimalloc's default delay (set \
             {PURGE_DELAY_VAR} to choose)"
        );
    }
}

/// Makes sure mimalloc runs with a purge delay the environment names: when
/// neither `MIMALLOC_PURGE_DELAY` nor its older name is set (in any case,
/// as mimalloc reads them), replaces this process (`execve`: same process
/// id, arguments and open files) with the same program and
/// `MIMALLOC_PURGE_DELAY=0`, and does not return. Call it first thing in
/// `main`, while the process has nothing open worth keeping. Returns what
/// was found, or why the process was not replaced.
///
/// The program is executed again as it was started — `argv[0]`, searched
/// in `PATH` when it names no directory, as a shell does — and only when
/// that is the very file this process runs (`/proc/self/exe`, compared by
/// device and inode). So the process keeps its name (the kernel names a
/// process after the file it executes: `ps`, `pgrep fencer` and `top` still
/// see the name it was started by, a symlink's included), and it is not
/// replaced when it was started through something else — the dynamic
/// loader (`ld.so fencer …`), valgrind — or when its binary was replaced or
/// removed since it started (an upgrade in place).
pub(crate) fn purge_freed_memory_at_once() -> PurgeDelay {
    if let Some((var, value)) = std::env::vars_os().find(|(k, _)| names_purge_delay(k)) {
        return PurgeDelay::Set { var, value };
    }
    let mut args = std::env::args_os();
    let Some(arg0) = args.next() else {
        return PurgeDelay::NotReplaced("it was started without a program name (argv[0])".into());
    };
    let program = match resolve(&arg0) {
        Some(p) if same_file(&p, Path::new(SELF_EXE)) => p,
        _ => {
            return PurgeDelay::NotReplaced(format!(
                "its program name {arg0:?} does not lead to the file it runs (started through a loader or \
                 a wrapper, or its binary was replaced since it started)"
            ));
        }
    };
    // `exec` returns only if it failed.
    let failed = Command::new(program).arg0(arg0).args(args).env(PURGE_DELAY_VAR, "0").exec();
    PurgeDelay::Failed(failed)
}

/// Whether an environment variable's name is one mimalloc reads its purge
/// delay from (mimalloc compares names ignoring ASCII case).
fn names_purge_delay(name: &OsStr) -> bool {
    let name = name.as_bytes();
    [PURGE_DELAY_VAR, PURGE_DELAY_LEGACY_VAR].iter().any(|v| name.eq_ignore_ascii_case(v.as_bytes()))
}

/// The file `arg0` names as a program: itself when it has a `/`, else the
/// first executable file of that name in `PATH`.
fn resolve(arg0: &OsStr) -> Option<PathBuf> {
    if arg0.as_bytes().contains(&b'/') {
        return Some(PathBuf::from(arg0));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(arg0))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

/// Whether two paths lead to the same file (device and inode).
fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mimallocs_names_are_matched_in_any_case() {
        for name in ["MIMALLOC_PURGE_DELAY", "mimalloc_purge_delay", "MiMalloc_Reset_Delay"] {
            assert!(names_purge_delay(OsStr::new(name)), "{name}");
        }
        for name in ["MIMALLOC_PURGE_DELAYS", "MIMALLOC_VERBOSE", "PURGE_DELAY", ""] {
            assert!(!names_purge_delay(OsStr::new(name)), "{name}");
        }
    }

    #[test]
    fn a_program_name_resolves_as_a_shell_would() {
        // With a directory: the path itself, found or not.
        assert_eq!(resolve(OsStr::new("./no-such-program")), Some(PathBuf::from("./no-such-program")));
        // Without: the first executable of that name in PATH (`sh` is on
        // every machine the tests run on).
        let sh = resolve(OsStr::new("sh")).expect("sh in PATH");
        assert!(sh.is_absolute() || sh.components().count() > 1, "{}", sh.display());
        assert_eq!(resolve(OsStr::new("no-such-program-fencer")), None);
    }

    #[test]
    fn this_test_binary_is_the_file_it_runs() {
        let me = std::env::current_exe().unwrap();
        assert!(same_file(&me, Path::new(SELF_EXE)));
        assert!(!same_file(Path::new("/bin/sh"), Path::new(SELF_EXE)));
        assert!(!same_file(Path::new("/no/such/file"), Path::new(SELF_EXE)));
    }
}
