//! The `fencer` command line against `fencer dev` processes:
//!
//! - `t29_allocator` — a coordinator returns freed memory to the system at
//!   once unless its environment sets mimalloc's purge delay.
//! - `t30_dev_restart` — kill -9 and restart keeps locks, tokens grow; the
//!   CLI's exit codes and JSON errors (t31).
//! - `t48_exec` — `fencer exec`: the lock in the command's environment,
//!   SIGTERM then SIGKILL before the deadline, documented exit codes.
//! - `t49_cli` — completions, `FENCER_*` variables, usage errors.

mod t29_allocator;
mod t30_dev_restart;
mod t39_python_recipe;
mod t48_exec;
mod t49_cli;
