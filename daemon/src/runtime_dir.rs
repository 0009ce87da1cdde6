//! The runtime directory is the daemon's own. It is created 0700 (0750 and given to `listen.group`
//! when one is set); an existing one is used only when the daemon's uid owns it, nobody else may
//! write to it and it is not a symbolic link, because whoever can write there can swap the embedded
//! Redis's socket or plant links the daemon would follow. The entries the daemon touches in it
//! (socket files, the embedded Redis's log) are looked at with `lstat` first, so a link is refused
//! rather than followed.

use std::fmt;
use std::fs::{self, File, Metadata};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Why the runtime directory cannot be used; each names the directory and what is wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeDirError {
    #[error("runtime directory {path}: cannot {action}: {source}")]
    Io {
        path: PathBuf,
        action: &'static str,
        source: io::Error,
    },
    #[error("runtime directory {path} is a symbolic link; set runtime_dir to a real directory")]
    Symlink { path: PathBuf },
    #[error("runtime directory {path} exists and is not a directory")]
    NotDirectory { path: PathBuf },
    #[error(
        "runtime directory {path} is owned by uid {owner}, not by the daemon's uid {daemon}; \
         remove it or set runtime_dir to a directory the daemon owns"
    )]
    NotOwned {
        path: PathBuf,
        owner: u32,
        daemon: u32,
    },
    #[error(
        "runtime directory {path} is writable by {who} (mode {mode:04o}); `chmod go-w` it or remove it"
    )]
    Writable {
        path: PathBuf,
        mode: u32,
        who: &'static str,
    },
    #[error("runtime directory {path}: unknown group `{group}` (listen.group)")]
    UnknownGroup { path: PathBuf, group: String },
}

/// What the daemon expects at a path in its runtime directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Socket,
    File,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Socket => "a socket",
            Kind::File => "a regular file",
        })
    }
}

/// Why an entry of the runtime directory is not used.
#[derive(Debug, thiserror::Error)]
pub enum EntryError {
    #[error(
        "{path} is a symbolic link; the daemon does not follow links in its runtime directory"
    )]
    Symlink { path: PathBuf },
    #[error("{path} is {found}, expected {expected}; remove it")]
    WrongKind {
        path: PathBuf,
        found: &'static str,
        expected: Kind,
    },
    #[error("{path} is owned by uid {owner}, not by the daemon's uid {daemon}")]
    NotOwned {
        path: PathBuf,
        owner: u32,
        daemon: u32,
    },
    #[error("{path} is missing")]
    Missing { path: PathBuf },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

/// Creates the runtime directory, or checks the one that is there, as the module header says.
pub fn prepare(path: &Path, group: Option<&str>) -> Result<(), RuntimeDirError> {
    let io_error = |action| {
        move |source| RuntimeDirError::Io {
            path: path.to_owned(),
            action,
            source,
        }
    };
    let gid = group.map(|group| group_id(path, group)).transpose()?;
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).map_err(io_error("create its parent"))?;
    }
    let mode = if gid.is_some() { 0o750 } else { 0o700 };
    let created = match fs::DirBuilder::new().mode(mode).create(path) {
        Ok(()) => true,
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => false,
        Err(error) => return Err(io_error("create it")(error)),
    };
    // Everything from here goes through one descriptor opened without following links, so what is
    // checked (and, when new, chmod-ed and chown-ed) is the directory itself, not a link's target.
    let dir = open_directory(path)?;
    if created {
        // The umask may have taken bits off the mode asked of mkdir.
        dir.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(io_error("set its mode"))?;
        if let Some(gid) = gid {
            std::os::unix::fs::fchown(&dir, None, Some(gid))
                .map_err(io_error("give it to listen.group"))?;
        }
    }
    let metadata = dir.metadata().map_err(io_error("inspect it"))?;
    judge(path, &metadata, nix::unistd::geteuid().as_raw())
}

/// Whether a directory with `metadata` may serve a daemon running as `daemon`.
fn judge(path: &Path, metadata: &Metadata, daemon: u32) -> Result<(), RuntimeDirError> {
    if metadata.uid() != daemon {
        return Err(RuntimeDirError::NotOwned {
            path: path.to_owned(),
            owner: metadata.uid(),
            daemon,
        });
    }
    let mode = metadata.mode() & 0o7777;
    let who = match (mode & 0o020 != 0, mode & 0o002 != 0) {
        (false, false) => return Ok(()),
        (true, false) => "its group",
        (false, true) => "everyone",
        (true, true) => "its group and everyone",
    };
    Err(RuntimeDirError::Writable {
        path: path.to_owned(),
        mode,
        who,
    })
}

fn open_directory(path: &Path) -> Result<File, RuntimeDirError> {
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(path)
        .map_err(|source| {
            // A link fails with ELOOP, or with ENOTDIR when it names a directory: ask lstat which.
            let linked = fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
            match source.raw_os_error() {
                Some(libc::ELOOP | libc::ENOTDIR) if linked => RuntimeDirError::Symlink {
                    path: path.to_owned(),
                },
                Some(libc::ENOTDIR) => RuntimeDirError::NotDirectory {
                    path: path.to_owned(),
                },
                _ => RuntimeDirError::Io {
                    path: path.to_owned(),
                    action: "open it",
                    source,
                },
            }
        })
}

fn group_id(path: &Path, group: &str) -> Result<u32, RuntimeDirError> {
    nix::unistd::Group::from_name(group)
        .ok()
        .flatten()
        .map(|group| group.gid.as_raw())
        .ok_or_else(|| RuntimeDirError::UnknownGroup {
            path: path.to_owned(),
            group: group.to_owned(),
        })
}

/// What is at `path`, looked at without following a link: `None` when nothing is, else its
/// metadata once it is known to be a `kind`.
pub fn inspect(path: &Path, kind: Kind) -> Result<Option<Metadata>, EntryError> {
    let metadata = match fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(EntryError::Io {
                path: path.to_owned(),
                source,
            })
        }
    };
    let file_type = metadata.file_type();
    if file_type.is_symlink() {
        return Err(EntryError::Symlink {
            path: path.to_owned(),
        });
    }
    let expected = match kind {
        Kind::Socket => file_type.is_socket(),
        Kind::File => file_type.is_file(),
    };
    if !expected {
        return Err(EntryError::WrongKind {
            path: path.to_owned(),
            found: describe(file_type),
            expected: kind,
        });
    }
    Ok(Some(metadata))
}

fn describe(file_type: fs::FileType) -> &'static str {
    if file_type.is_socket() {
        "a socket"
    } else if file_type.is_file() {
        "a regular file"
    } else if file_type.is_dir() {
        "a directory"
    } else {
        "a special file"
    }
}

/// Removes a stale `kind` at `path` (nothing there is fine); a link or anything else is refused.
pub fn remove_stale(path: &Path, kind: Kind) -> Result<(), EntryError> {
    if inspect(path, kind)?.is_some() {
        fs::remove_file(path).map_err(|source| EntryError::Io {
            path: path.to_owned(),
            source,
        })?;
    }
    Ok(())
}

/// Checks that `path` is a `kind` the daemon's uid owns: a file its own child created.
pub fn check_own(path: &Path, kind: Kind) -> Result<(), EntryError> {
    let metadata = inspect(path, kind)?.ok_or_else(|| EntryError::Missing {
        path: path.to_owned(),
    })?;
    let daemon = nix::unistd::geteuid().as_raw();
    if metadata.uid() != daemon {
        return Err(EntryError::NotOwned {
            path: path.to_owned(),
            owner: metadata.uid(),
            daemon,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    fn mode_of(path: &Path) -> u32 {
        fs::symlink_metadata(path).unwrap().mode() & 0o7777
    }

    #[test]
    fn a_new_directory_is_private_whatever_the_umask() {
        let base = scratch();
        let dir = base.path().join("a/b/run");
        // A umask that would leave group and others everything except write.
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o002));
        let prepared = prepare(&dir, None);
        nix::sys::stat::umask(old);
        prepared.unwrap();
        assert_eq!(mode_of(&dir), 0o700);
        // A second start accepts what the first made.
        prepare(&dir, None).unwrap();
    }

    #[test]
    fn with_a_group_the_new_directory_is_0750_and_that_groups() {
        let base = scratch();
        let dir = base.path().join("run");
        let own = nix::unistd::getegid();
        let group = nix::unistd::Group::from_gid(own).unwrap().unwrap().name;
        prepare(&dir, Some(&group)).unwrap();
        assert_eq!(mode_of(&dir), 0o750);
        assert_eq!(fs::metadata(&dir).unwrap().gid(), own.as_raw());
        let unknown =
            prepare(&base.path().join("other"), Some("no-such-group-tollgate")).unwrap_err();
        assert!(
            matches!(unknown, RuntimeDirError::UnknownGroup { .. }),
            "{unknown}"
        );
    }

    #[test]
    fn a_group_or_world_writable_directory_is_refused_and_left_as_it_was() {
        for (mode, who) in [
            (0o770, "its group"),
            (0o707, "everyone"),
            (0o1777, "its group and everyone"),
        ] {
            let base = scratch();
            let dir = base.path().join("run");
            fs::create_dir(&dir).unwrap();
            fs::set_permissions(&dir, fs::Permissions::from_mode(mode)).unwrap();
            let error = prepare(&dir, None).unwrap_err();
            assert!(
                matches!(&error, RuntimeDirError::Writable { who: w, .. } if *w == who),
                "{mode:o}: {error}"
            );
            assert!(
                error.to_string().contains(&dir.display().to_string()),
                "{error}"
            );
            assert_eq!(
                mode_of(&dir),
                mode,
                "the daemon does not repair what it refuses"
            );
        }
    }

    #[test]
    fn a_symlinked_directory_is_refused_even_when_its_target_is_fine() {
        let base = scratch();
        let target = base.path().join("real");
        fs::create_dir(&target).unwrap();
        fs::set_permissions(&target, fs::Permissions::from_mode(0o700)).unwrap();
        let link = base.path().join("run");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let error = prepare(&link, None).unwrap_err();
        assert!(matches!(error, RuntimeDirError::Symlink { .. }), "{error}");
        let file = base.path().join("file");
        fs::write(&file, "").unwrap();
        let error = prepare(&file, None).unwrap_err();
        assert!(
            matches!(error, RuntimeDirError::NotDirectory { .. }),
            "{error}"
        );
    }

    #[test]
    fn a_directory_another_uid_owns_is_refused() {
        let base = scratch();
        let metadata = fs::metadata(base.path()).unwrap();
        let stranger = metadata.uid().wrapping_add(1);
        let error = judge(base.path(), &metadata, stranger).unwrap_err();
        assert!(
            matches!(error, RuntimeDirError::NotOwned { owner, daemon, .. }
                if owner == metadata.uid() && daemon == stranger),
            "{error}"
        );
    }

    #[test]
    fn entries_are_looked_at_without_following_links() {
        let base = scratch();
        let target = base.path().join("target");
        fs::write(&target, "keep").unwrap();
        let link = base.path().join("redis.log");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(matches!(
            inspect(&link, Kind::File),
            Err(EntryError::Symlink { .. })
        ));
        assert!(matches!(
            remove_stale(&link, Kind::File),
            Err(EntryError::Symlink { .. })
        ));
        assert!(link.exists() && fs::read_to_string(&target).unwrap() == "keep");

        assert!(inspect(&base.path().join("absent"), Kind::File)
            .unwrap()
            .is_none());
        assert!(matches!(
            remove_stale(&target, Kind::Socket),
            Err(EntryError::WrongKind { .. })
        ));
        assert!(
            target.exists(),
            "a regular file is not taken for a stale socket"
        );
        remove_stale(&target, Kind::File).unwrap();
        assert!(!target.exists());
    }

    #[test]
    fn an_own_socket_passes_and_a_missing_one_does_not() {
        let base = scratch();
        let path = base.path().join("redis.sock");
        assert!(matches!(
            check_own(&path, Kind::Socket),
            Err(EntryError::Missing { .. })
        ));
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        check_own(&path, Kind::Socket).unwrap();
    }
}
