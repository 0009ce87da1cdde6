//! `tollgate module new DIR --lang rust|js|python`: a module directory from the templates under
//! `templates/` — the guard world's WIT (the bindings' source in every language), the example
//! guard (deny keys outside `<principal><separator>`), tests.yaml and a README of three commands.

use std::path::Path;

use anyhow::{bail, Context, Result};

use super::{module_name, Lang};

const WIT: &str = include_str!("../../../../wit/policy.wit");
const TESTS: &str = include_str!("templates/tests.yaml");
const README: &str = include_str!("templates/README.md");
const RUST_MANIFEST: &str = include_str!("templates/rust/Cargo.toml");
const RUST_SOURCE: &str = include_str!("templates/rust/src/lib.rs");
const JS_SOURCE: &str = include_str!("templates/js/guard.js");
const PYTHON_SOURCE: &str = include_str!("templates/python/guard.py");

pub fn create(dir: &Path, lang: Lang) -> Result<()> {
    let name = module_name(dir)?;
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        || !name.as_bytes()[0].is_ascii_alphabetic()
    {
        bail!("module name `{name}`: use a letter, then letters, digits, `-` or `_`");
    }
    if dir.exists() && dir.read_dir()?.next().is_some() {
        bail!("{} exists and is not empty", dir.display());
    }
    let source = match lang {
        Lang::Rust => "src/lib.rs",
        Lang::Js => "guard.js",
        Lang::Python => "guard.py",
    };
    // A Python instance starts with CPython's heap (12.4 MiB of the default 16 MiB cap, see
    // BENCHMARKS.md): its README's config line gives it room. QuickJS and Rust fit the defaults.
    let limits = match lang {
        Lang::Rust => "",
        Lang::Js => "",
        Lang::Python => ", limits: { memory_mib: 32 }",
    };
    let fill = |template: &str| {
        template
            .replace("{{name}}", &name)
            .replace("{{lang}}", lang.name())
            .replace("{{source}}", source)
            .replace("{{dir}}", &dir.display().to_string())
            .replace("{{limits}}", limits)
    };
    let mut files: Vec<(&str, String)> = vec![
        ("wit/policy.wit", WIT.to_owned()),
        ("tests.yaml", TESTS.to_owned()),
        ("README.md", fill(README)),
        (".gitignore", "/build/\n/target/\n__pycache__/\n".to_owned()),
    ];
    match lang {
        Lang::Rust => {
            files.push(("Cargo.toml", fill(RUST_MANIFEST)));
            files.push(("src/lib.rs", RUST_SOURCE.to_owned()));
        }
        Lang::Js => files.push(("guard.js", JS_SOURCE.to_owned())),
        Lang::Python => files.push(("guard.py", PYTHON_SOURCE.to_owned())),
    }
    for (path, text) in files {
        let path = dir.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    println!(
        "{}: a {} guard module `{name}`; next: tollgate module build {0}",
        dir.display(),
        lang.name()
    );
    Ok(())
}
