//! `fencer completions SHELL`: shell completion scripts on stdout.

use std::process::ExitCode;

use clap_complete::Shell;

/// Arguments of `fencer completions`.
#[derive(Debug, clap::Args)]
pub(crate) struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    #[arg(value_enum)]
    shell: Shell,
}

/// Writes the completion script of `command` for the chosen shell.
pub(crate) fn run(args: CompletionsArgs, mut command: clap::Command) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let name = command.get_name().to_string();
    // Generated into memory first: clap_complete panics on a closed stdout.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, name, &mut script);
    match std::io::stdout().lock().write_all(&script) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(ExitCode::SUCCESS),
    }
}
