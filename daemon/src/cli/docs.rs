//! `tollgate completions SHELL` and `tollgate man DIR`: shell completions (clap_complete) and man
//! pages (clap_mangen) generated from the CLI itself, so they cannot drift from it.
//! `scripts/package.sh` runs both for the Debian package.

use std::path::Path;
use std::process::ExitCode;

use clap::{Command, CommandFactory};

use super::Cli;

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// Prints the completion script for `shell` on stdout.
pub fn completions(shell: Shell) -> ExitCode {
    let mut command = Cli::command();
    let shell = match shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    clap_complete::generate(shell, &mut command, "tollgate", &mut std::io::stdout());
    ExitCode::SUCCESS
}

/// Writes `tollgate.1` and one page per subcommand (`tollgate-lease-acquire.1`, …) into `dir`.
pub fn man(dir: &Path) -> ExitCode {
    let written = std::fs::create_dir_all(dir).and_then(|()| {
        let mut command = Cli::command();
        command.build();
        write_pages(&command, dir)
    });
    match written {
        Ok(count) => {
            println!("{count} man pages written to {}", dir.display());
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("tollgate man: {}: {error}", dir.display());
            ExitCode::FAILURE
        }
    }
}

/// `command`'s page, then its subcommands', each named by its display name (`build` makes it
/// `tollgate-lease-acquire`); how many were written.
fn write_pages(command: &Command, dir: &Path) -> std::io::Result<usize> {
    let name = command
        .get_display_name()
        .unwrap_or_else(|| command.get_name());
    let mut page = Vec::new();
    clap_mangen::Man::new(command.clone()).render(&mut page)?;
    std::fs::write(dir.join(format!("{name}.1")), page)?;
    let mut count = 1;
    for sub in command
        .get_subcommands()
        .filter(|sub| sub.get_name() != "help")
    {
        count += write_pages(sub, dir)?;
    }
    Ok(count)
}
