//! `tollgate redis-acl`: the Redis ACL users an external Redis needs for the daemon under the
//! policy of a config file (the default policy without one), as `ACL SETUSER` lines to pipe into `redis-cli` (on every server of a Sentinel group: Redis does not
//! replicate ACLs), with passwords kept in files in a directory of the operator's choosing; and,
//! with `--lanes-yaml`, the `lanes:` section of `tollgate.yaml` that points at those users. The
//! users include the policy's scope users (its key-confined principals' scripts run as them),
//! which the daemon checks on the master before using (`scope_users.rs`).
//!
//! The lines end by creating an administrator (`tollgate-admin`, its password in the same
//! directory) and turning Redis's `default` user off: the reserved keyspace is only as safe as
//! every user Redis has, and a stock `default` has no password and every key, so any local user
//! could rewrite a lease or a fence counter. Why, and what to put in the config for the
//! administrator, goes to standard error, so the standard output can be piped into `redis-cli`.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use tollgate_lanes::{daemon_users, password_in, Admin, DaemonUser, EMBEDDED_ADMIN};
use tollgate_policy::Generation;

use crate::config::Config;

#[derive(Debug, clap::Args)]
pub struct RedisAclArgs {
    /// Directory of the password files (`lane-<lane>.password`, `leases.password`, and
    /// `<scope user>.password` for each scope of the policy), created 0700 if missing; a missing
    /// file is created with a random password, mode 0600.
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
    let generation = match crate::lane_acl::compiled(&policy) {
        Ok(generation) => generation,
        Err(error) => {
            eprintln!("tollgate: policy: {error}");
            return ExitCode::FAILURE;
        }
    };
    let grants = crate::lane_acl::grants(&generation.admissible());
    let users = daemon_users(&args.passwords, &grants);
    let scopes = scope_users(&args.passwords, &generation);
    let printed = if args.lanes_yaml {
        lanes_yaml(&users, &args.passwords)
    } else {
        let all: Vec<DaemonUser> = users.into_iter().chain(scopes).collect();
        setuser_lines(&all).and_then(|mut lines| {
            lines.push_str(&default_off_lines(&args.passwords)?);
            eprint!("{}", why_default_off(&args.passwords));
            Ok(lines)
        })
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

/// The scope users of `generation` (its key-confined principals' scripts and transactions run as
/// them: docs/policy.md, "Scopes"), their passwords in `<dir>/<user>.password`, where the daemon
/// reads them (`lanes.scopes.passwords`). A scope user's name is a digest of its grants: a
/// policy that changes a scope names a new user, to be made again from these lines.
fn scope_users(dir: &Path, generation: &Generation) -> Vec<DaemonUser> {
    generation
        .scopes()
        .scopes
        .iter()
        .map(|scope| {
            let user = crate::scope_users::scope_user(scope);
            DaemonUser {
                lane: None,
                password_file: dir.join(format!("{}.password", user.name)),
                rules: user.acl_rules(),
                name: user.name,
            }
        })
        .collect()
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

/// An administrator to use instead of `default` (every command and key, a password of its own in
/// `<dir>/admin.password`), then `default` off: no password works for it any more, and no
/// connection logs in as it. Last, so that `redis-cli` piping these lines in as `default` runs
/// every line before.
fn default_off_lines(dir: &Path) -> Result<String, String> {
    let file = dir.join("admin.password");
    let password = password_in(&file).map_err(|error| format!("{}: {error}", file.display()))?;
    let mut admin: Vec<String> = ["ACL", "SETUSER", EMBEDDED_ADMIN, "reset", "on"]
        .map(str::to_owned)
        .into();
    admin.push(format!(">{password}"));
    admin.extend(Admin::acl_rules().split(' ').map(str::to_owned));
    let default_off = ["ACL", "SETUSER", "default", "off", "resetpass"].map(str::to_owned);
    Ok([admin.as_slice(), default_off.as_slice()]
        .iter()
        .map(|line| {
            let quoted: Vec<String> = line.iter().map(|arg| quoted(arg)).collect();
            quoted.join(" ") + "\n"
        })
        .collect())
}

/// What standard error says about the last two lines.
fn why_default_off(dir: &Path) -> String {
    let file = dir.join("admin.password");
    format!(
        "# The last two lines create `{EMBEDDED_ADMIN}` (password in {file}) and turn Redis's \
         `default` user off.\n\
         # Why: the daemon's reserved keyspace (`tollgate:*`: leases, fence counters) is only as \
         safe as every user Redis has. A stock `default` user has no password and every key, so \
         any local user could delete a lease or reset a fence counter; the daemon refuses to \
         start while any user it did not make could.\n\
         # Afterwards log in as `{EMBEDDED_ADMIN}` (`redis-cli --user {EMBEDDED_ADMIN} --pass \
         \"$(cat {file})\"`), and name it in the config, since it can reach every key:\n\
         #   redis:\n#     trusted_users: [{EMBEDDED_ADMIN}]\n\
         # Run the lines on every server: masters and replicas, every node of a cluster (Redis \
         does not replicate ACLs). Replicas then log in to their master with `masteruser \
         {EMBEDDED_ADMIN}` and `masterauth`, sentinels with `sentinel auth-user` and \
         `sentinel auth-pass` (docs/cluster.md).\n",
        file = file.display()
    )
}

fn lanes_yaml(users: &[DaemonUser], dir: &Path) -> Result<String, String> {
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
    out.push_str(&format!(
        "  scopes: {{ passwords: {:?} }}\n",
        absolute(dir)?.display().to_string()
    ));
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
