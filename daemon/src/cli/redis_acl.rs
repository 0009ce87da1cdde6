//! `tollgate redis-acl`: the Redis ACL users an external Redis needs for the daemon under the
//! policy of a config file (the default policy without one), as `ACL SETUSER` lines to pipe into `redis-cli` (on every server of a Sentinel group: Redis does not
//! replicate ACLs), with passwords kept in files in a directory of the operator's choosing; and,
//! with `--lanes-yaml`, the `lanes:` section of `tollgate.yaml` that points at those users.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use tollgate_lanes::{daemon_users, password_in, DaemonUser};

use crate::config::Config;

#[derive(Debug, clap::Args)]
pub struct RedisAclArgs {
    /// Directory of the password files (`lane-<lane>.password`, `leases.password`), created 0700
    /// if missing; a missing file is created with a random password, mode 0600.
    #[arg(long)]
    passwords: PathBuf,
    /// Print the `lanes:` section of the config instead of the ACL commands.
    #[arg(long)]
    lanes_yaml: bool,
    /// The daemon's configuration: the lane users get the commands its policy can admit.
    #[arg(long, short)]
    config: Option<PathBuf>,
}

pub fn run(args: RedisAclArgs) -> ExitCode {
    // The passwords are secrets: a directory of their own that only this user can enter.
    if let Err(error) = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&args.passwords)
    {
        eprintln!("tollgate: {}: {error}", args.passwords.display());
        return ExitCode::FAILURE;
    }
    let policy = match &args.config {
        Some(file) => match Config::load(file) {
            Ok(config) => config.policy,
            Err(error) => {
                eprintln!("tollgate: {error}");
                return ExitCode::FAILURE;
            }
        },
        None => Default::default(),
    };
    let grants = match crate::lane_acl::grants_for(&policy) {
        Ok(grants) => grants,
        Err(error) => {
            eprintln!("tollgate: policy: {error}");
            return ExitCode::FAILURE;
        }
    };
    let users = daemon_users(&args.passwords, &grants);
    let printed = if args.lanes_yaml {
        lanes_yaml(&users)
    } else {
        setuser_lines(&users)
    };
    match printed {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("tollgate: {error}");
            ExitCode::FAILURE
        }
    }
}

fn setuser_lines(users: &[DaemonUser]) -> Result<String, String> {
    let mut out = String::new();
    for user in users {
        let password = password_in(&user.password_file)
            .map_err(|error| format!("{}: {error}", user.password_file.display()))?;
        let line: Vec<String> = user.setuser(&password).iter().map(|a| quoted(a)).collect();
        out.push_str(&line.join(" "));
        out.push('\n');
    }
    Ok(out)
}

fn lanes_yaml(users: &[DaemonUser]) -> Result<String, String> {
    let mut out = String::from("lanes:\n");
    for user in users {
        let section = user.lane.map_or("leases", |lane| lane.as_str());
        let file = absolute(&user.password_file)?;
        out.push_str(&format!(
            "  {section}: {{ user: {}, password_file: {:?} }}\n",
            user.name,
            file.display().to_string()
        ));
    }
    Ok(out)
}

fn absolute(path: &Path) -> Result<PathBuf, String> {
    std::path::absolute(path).map_err(|error| format!("{}: {error}", path.display()))
}

/// An argument as `redis-cli` reads it from a line: in double quotes with `"` and `\` escaped.
fn quoted(arg: &str) -> String {
    format!("\"{}\"", arg.replace('\\', "\\\\").replace('"', "\\\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_quoted_for_redis_cli() {
        assert_eq!(quoted("~[^t]*"), "\"~[^t]*\"");
        assert_eq!(quoted(r#"a"b\c"#), r#""a\"b\\c""#);
    }
}
