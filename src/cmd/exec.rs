//! `fencer exec RESOURCE [--ttl D] [--wait D] -- COMMAND [ARG…]`: run a
//! command while holding a lock (DESIGN §5).
//!
//! 1. Acquire the lock (retries with one request id, like `fencer acquire`).
//!    Not acquired → exit 203 without running anything.
//! 2. Start the command in its own process group with `FENCER_RESOURCE`,
//!    `FENCER_TOKEN`, `FENCER_LEASE_ID` and `FENCER_SIGNED_TOKEN` (the
//!    coordinator's signed token, empty if the grant carried none) in its
//!    environment. The lease
//!    renews itself meanwhile.
//! 3. If the lease stays Uncertain longer than `--term-grace` (default
//!    ttl/6), send SIGTERM to the group; if it is still running
//!    `--kill-before` (default ttl/20) before the local deadline, SIGKILL.
//!    If the lease is Lost outright (the server says so, or the deadline
//!    passed), SIGKILL at once: there is no time left.
//! 4. When the command ends, release the lock and exit with its status (or
//!    204 if fencer had to stop it because of the lock).
//!
//! The whole process group is signalled so that what the command started
//! (`sh -c 'a; b'` runs `a` as a child) stops too. SIGINT, SIGTERM, SIGHUP
//! and SIGQUIT sent to fencer are forwarded to the group. If fencer itself is
//! killed with SIGKILL nothing stops the command; the fencing token is what
//! still protects the data then.
//!
//! Exit codes are in `exit`.

use std::ffi::OsString;
use std::process::{ExitCode, ExitStatus};
use std::time::Duration;

use fencer_client::{Lease, LeaseState};
use rustix::process::{Pid, Signal, kill_process_group};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::{Instant, sleep_until};

use super::lock::{ClientArgs, LockArgs, report_acquire};
use super::parse_duration;
use crate::exit;

/// How long releasing the lock may take once the command ended.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);
/// The same when the lease is not Held: the server may be unreachable, and
/// the lease expires soon anyway.
const RELEASE_TIMEOUT_IN_DOUBT: Duration = Duration::from_secs(1);

/// Arguments of `fencer exec`.
#[derive(Debug, clap::Args)]
pub(crate) struct ExecArgs {
    /// The resource to lock, e.g. `jobs/nightly-report`.
    resource: String,
    #[command(flatten)]
    lock: LockArgs,
    /// How long the lease may stay Uncertain (a renewal failed or is late)
    /// before the command gets SIGTERM. Default: ttl/6.
    #[arg(long, env = "FENCER_TERM_GRACE", value_parser = parse_duration)]
    term_grace: Option<Duration>,
    /// Send SIGKILL this long before the lease's local deadline if the
    /// command is still running then. Default: ttl/20.
    #[arg(long, env = "FENCER_KILL_BEFORE", value_parser = parse_duration)]
    kill_before: Option<Duration>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
    #[command(flatten)]
    client: ClientArgs,
}

/// `user@host/pid exec PROGRAM`, fitting the server's holder rules (at most
/// 256 bytes, no control characters).
fn default_holder(program: &OsString) -> String {
    let name = std::path::Path::new(program).file_name().unwrap_or(program.as_os_str()).to_string_lossy();
    let mut holder: String = format!("{} exec {name}", fencer_client::default_holder())
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    while holder.len() > 250 {
        holder.pop();
    }
    holder
}

/// Whether the command line invokes `fencer exec` (for the exit code of a
/// usage error, which must not look like a command's status).
pub(crate) fn is_exec_invocation(args: impl IntoIterator<Item = OsString>) -> bool {
    let mut args = args.into_iter().skip(1);
    while let Some(arg) = args.next() {
        let arg = arg.to_string_lossy();
        if matches!(
            arg.as_ref(),
            "--log"
                | "--log-format"
                | "--endpoints"
                | "-o"
                | "--output"
                | "--ca"
                | "--cert"
                | "--key"
                | "--bearer-token"
                | "--bearer-token-file"
                | "--tls-server-name"
        ) {
            args.next();
            continue;
        }
        if arg.starts_with('-') {
            continue;
        }
        return arg == "exec";
    }
    false
}

pub(crate) async fn run(args: ExecArgs) -> anyhow::Result<ExitCode> {
    let output = args.client.output;
    let client = match args.client.client() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fencer: {e:#}");
            return Ok(ExitCode::from(exit::exec::OFFSET + exit::INVALID));
        }
    };
    let program = args.command[0].clone();
    let mut lock = args.lock.clone();
    if lock.holder.is_none() {
        lock.holder = Some(default_holder(&program));
    }
    let lease = match lock.acquire(&client, &args.resource).await {
        Ok(lease) => lease,
        Err(e) => {
            report_acquire(output, &e, &lock);
            return Ok(exit::exec_for_error(e.client_error()));
        }
    };
    let ttl = lease.ttl();
    let timing =
        Signals { term_grace: args.term_grace.unwrap_or(ttl / 6), kill_before: args.kill_before.unwrap_or(ttl / 20) };
    tracing::info!(resource = %lease.resource(), token = %lease.token(), ttl = ?ttl, "lock acquired; starting the command");

    let mut command = tokio::process::Command::new(&program);
    command
        .args(&args.command[1..])
        .env("FENCER_RESOURCE", lease.resource())
        .env("FENCER_TOKEN", lease.token().to_string())
        .env("FENCER_LEASE_ID", lease.lease_id().to_string())
        .env("FENCER_SIGNED_TOKEN", lease.signed_token().unwrap_or_default())
        // Its own group, so that signals reach everything it starts.
        .process_group(0);
    let child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("fencer: cannot start {}: {e}", program.to_string_lossy());
            release(lease).await;
            return Ok(ExitCode::from(exit::exec::CANNOT_START));
        }
    };
    let outcome = supervise(child, &lease, timing).await?;
    if outcome.stopped_for_lock {
        eprintln!(
            "fencer: the lock on {} was {}; the command was stopped ({})",
            lease.resource(),
            lease.check(),
            describe(outcome.status)
        );
        release(lease).await;
        return Ok(ExitCode::from(exit::exec::LOCK_LOST));
    }
    let state = lease.check();
    if state != LeaseState::Held {
        tracing::warn!(%state, "the command ended while the lease was not confirmed");
    }
    release(lease).await;
    Ok(ExitCode::from(status_code(outcome.status)))
}

/// When to signal the command, from the lease's ttl.
#[derive(Debug, Clone, Copy)]
struct Signals {
    term_grace: Duration,
    kill_before: Duration,
}

struct Outcome {
    status: ExitStatus,
    /// fencer signalled the command because of the lock, or the lease was lost while it ran.
    stopped_for_lock: bool,
}

/// Sends `sig` to the command's process group, logging why and where the
/// lease's local deadline is (as wall-clock milliseconds, for operators and
/// tests that compare it with what the command did).
fn group_signal(pid: Option<Pid>, sig: Signal, why: &str, deadline: Instant) {
    let Some(pid) = pid else { return };
    let to_deadline = deadline.saturating_duration_since(Instant::now());
    let deadline_unix_ms = (std::time::SystemTime::now() + to_deadline)
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    tracing::warn!(
        signal = ?sig,
        pgid = pid.as_raw_nonzero().get(),
        ms_before_deadline = to_deadline.as_millis() as u64,
        deadline_unix_ms,
        "{why}"
    );
    if let Err(e) = kill_process_group(pid, sig) {
        // ESRCH: the group is gone already.
        tracing::debug!(error = %e, "could not signal the command's process group");
    }
}

/// Waits for the command, stopping it when the lease is in doubt or lost
/// and forwarding the signals fencer receives.
async fn supervise(mut child: tokio::process::Child, lease: &Lease, timing: Signals) -> anyhow::Result<Outcome> {
    let pid = child.id().and_then(|id| Pid::from_raw(id as i32));
    let mut states = lease.state();
    let mut forward = Forwarded::new()?;
    let mut uncertain_since: Option<Instant> = None;
    let (mut termed, mut killed, mut lost) = (false, false, false);
    loop {
        match lease.check() {
            LeaseState::Held => uncertain_since = None,
            LeaseState::Uncertain => {
                uncertain_since.get_or_insert_with(Instant::now);
            }
            LeaseState::Lost(reason) => {
                lost = true;
                if !killed {
                    killed = true;
                    let why = format!("lease lost ({reason}): SIGKILL to the command");
                    group_signal(pid, Signal::KILL, &why, lease.deadline());
                }
            }
        }
        let deadline = lease.deadline();
        let kill_at = deadline.checked_sub(timing.kill_before).unwrap_or(deadline);
        let term_at = uncertain_since.map(|since| (since + timing.term_grace).min(kill_at));
        tokio::select! {
            status = child.wait() => {
                let status = status?;
                return Ok(Outcome { status, stopped_for_lock: termed || killed || lost });
            }
            changed = states.changed() => {
                if changed.is_err() {
                    // The lease is gone; the check above says Lost next time.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            () = sleep_until(term_at.unwrap_or(kill_at)), if term_at.is_some() && !termed && !killed => {
                termed = true;
                let why = "lease uncertain for longer than the grace period: SIGTERM to the command";
                group_signal(pid, Signal::TERM, why, deadline);
            }
            () = sleep_until(kill_at), if !killed => {
                // A renewal may have moved the deadline meanwhile.
                let kill_at = lease.deadline().checked_sub(timing.kill_before).unwrap_or(deadline);
                if Instant::now() >= kill_at {
                    killed = true;
                    let why = "the lease's local deadline is near: SIGKILL to the command";
                    group_signal(pid, Signal::KILL, why, deadline);
                }
            }
            sig = forward.recv() => {
                group_signal(pid, sig, "forwarding a signal to the command", lease.deadline());
            }
        }
    }
}

/// The signals fencer forwards to the command instead of dying of them.
struct Forwarded {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
}

impl Forwarded {
    fn new() -> anyhow::Result<Self> {
        Ok(Self {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
        })
    }

    async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.int.recv() => Signal::INT,
            _ = self.term.recv() => Signal::TERM,
            _ = self.hup.recv() => Signal::HUP,
            _ = self.quit.recv() => Signal::QUIT,
        }
    }
}

async fn release(lease: Lease) {
    let resource = lease.resource().to_string();
    let limit = if lease.is_held() { RELEASE_TIMEOUT } else { RELEASE_TIMEOUT_IN_DOUBT };
    match tokio::time::timeout(limit, lease.release()).await {
        Ok(Ok(_)) => tracing::info!(%resource, "lock released"),
        Ok(Err(e)) => tracing::warn!(%resource, error = %e, "could not release the lock; it will expire after its ttl"),
        Err(_) => tracing::warn!(%resource, "releasing the lock timed out; it will expire after its ttl"),
    }
}

/// A command's status as a shell reports it: its code, or 128 + the signal.
fn status_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => 128u8.saturating_add(sig as u8),
        (None, None) => exit::exec::ERROR,
    }
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("it exited with {code}"),
        (None, Some(sig)) => format!("it died of signal {sig}"),
        (None, None) => "it ended".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<OsString> {
        std::iter::once("fencer").chain(line.split_whitespace()).map(OsString::from).collect()
    }

    #[test]
    fn finds_the_exec_subcommand_past_global_flags() {
        assert!(is_exec_invocation(args("exec jobs/x -- true")));
        assert!(is_exec_invocation(args("--log debug -o json exec jobs/x --bogus")));
        assert!(is_exec_invocation(args("--endpoints a:1,b:2 exec")));
        assert!(!is_exec_invocation(args("acquire exec")));
        assert!(!is_exec_invocation(args("--log exec acquire x")));
        assert!(!is_exec_invocation(args("")));
    }

    #[test]
    fn the_default_holder_fits_the_server_rules() {
        let long = OsString::from(format!("/bin/{}\n", "é".repeat(300)));
        let holder = default_holder(&long);
        assert!(holder.len() <= 256 && !holder.chars().any(char::is_control), "{holder:?}");
        assert!(default_holder(&OsString::from("/usr/bin/backup")).ends_with(" exec backup"));
    }

    #[test]
    fn statuses_map_like_a_shell() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status_code(ExitStatus::from_raw(7 << 8)), 7);
        assert_eq!(status_code(ExitStatus::from_raw(9)), 137);
        assert_eq!(status_code(ExitStatus::from_raw(15)), 143);
    }
}
