//! The YAML policy compiler (`tollgate_policy::compile::compile`) on mutated policies and
//! hostile YAML: it returns a policy or diagnostics, never panics, and every diagnostic points
//! into the file (line and column from 1); deep nesting, alias bombs, huge globs and many rules
//! end in a result, nesting past the limit in the nesting error at its line and column.

use std::path::Path;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use tollgate_policy::compile::{self, CatalogCommand, CatalogIndex, Diagnostic};
use tollgate_policy::{Category, DEFAULT_POLICY};

use crate::mutate::{apply, mutations};
use crate::support::check;

/// Bytes that mean something in YAML.
const SPECIALS: &[u8] = b"-:[]{}&*!|>'\"#,? \t\n%@`";

/// A catalog of a few commands of each kind the compiler tells apart.
fn catalog() -> CatalogIndex {
    let command = |categories: &[Category], scripting: bool, keyed: bool| CatalogCommand {
        categories: categories.iter().copied().collect(),
        scripting,
        keyed,
    };
    let commands = [
        (
            "GET",
            command(&[Category::Read, Category::String], false, true),
        ),
        (
            "SET",
            command(&[Category::Write, Category::String], false, true),
        ),
        (
            "MSET",
            command(&[Category::Write, Category::String], false, true),
        ),
        (
            "KEYS",
            command(&[Category::Keyspace, Category::Read], false, false),
        ),
        (
            "FLUSHALL",
            command(&[Category::Keyspace, Category::Write], false, false),
        ),
        ("EVAL", command(&[Category::Scripting], true, false)),
        ("PING", command(&[Category::Connection], false, false)),
        ("CLIENT", command(&[Category::Connection], false, false)),
        ("CLIENT KILL", command(&[Category::Admin], false, false)),
    ];
    CatalogIndex {
        commands: commands
            .into_iter()
            .map(|(name, command)| (name.to_owned(), command))
            .collect(),
    }
}

/// Compiles `text`; checks what every outcome promises and returns the diagnostics, if any.
fn compile_checked(text: &str) -> Result<Vec<Diagnostic>, TestCaseError> {
    let lines = text.lines().count().max(1);
    let deadline = Instant::now() + Duration::from_secs(60);
    let diagnostics = match compile::compile(Path::new("fuzz.yaml"), text, &catalog(), deadline) {
        Ok(compiled) => compiled.warnings,
        Err(errors) => {
            prop_assert!(!errors.is_empty(), "an error result without a diagnostic");
            errors
        }
    };
    for diagnostic in &diagnostics {
        prop_assert!(
            diagnostic.line >= 1 && diagnostic.column >= 1,
            "{}",
            diagnostic
        );
        prop_assert!(
            diagnostic.line <= lines + 1,
            "{} is past the end",
            diagnostic
        );
        prop_assert!(!diagnostic.message.is_empty());
    }
    Ok(diagnostics)
}

fn mutated_policy() -> impl Strategy<Value = String> {
    let base = prop_oneof![
        Just(DEFAULT_POLICY.to_owned()),
        Just(
            "principals:\n  app: { uids: [1000] }\nrules:\n  - id: r\n    principals: [app]\n    \
             commands: [GET, SET]\n    keys: [\"app:*\"]\n    allow: x\n"
                .to_owned()
        ),
    ];
    (base, mutations(6, SPECIALS)).prop_map(|(base, mutations)| {
        String::from_utf8_lossy(&apply(base.into_bytes(), &mutations)).into_owned()
    })
}

/// Documents built to make a compiler work: deep nesting, alias bombs, huge globs, many rules.
fn hostile() -> impl Strategy<Value = String> {
    prop_oneof![
        (1usize..3000).prop_map(|depth| format!(
            "rules: {}{}",
            "[".repeat(depth),
            "]".repeat(depth)
        )),
        (1usize..3000).prop_map(|depth| format!(
            "principals: {}1{}",
            "{a: ".repeat(depth),
            "}".repeat(depth)
        )),
        (1usize..400).prop_map(|depth| {
            (0..depth)
                .map(|at| format!("{}- x\n", "  ".repeat(at)))
                .collect::<String>()
        }),
        (1usize..12).prop_map(|levels| {
            let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
            for level in 1..=levels {
                let previous = format!("*a{}", level - 1);
                let refs = vec![previous; 10].join(", ");
                text.push_str(&format!("a{level}: &a{level} [{refs}]\n"));
            }
            text.push_str(&format!("rules: *a{levels}\n"));
            text
        }),
        (1usize..20_000, "[*?\\[\\]a-z^]{1,8}").prop_map(|(repeat, piece)| {
            format!(
                "principals:\n  p: {{ any: true }}\nrules:\n  - id: g\n    commands: [GET]\n    \
                 keys: [\"{}\"]\n    allow: x\n",
                piece.repeat(repeat).replace('"', "")
            )
        }),
        (1usize..400).prop_map(|count| {
            let mut text = String::from("principals:\n  p: { any: true }\nrules:\n");
            for at in 0..count {
                text.push_str(&format!(
                    "  - id: r{at}\n    commands: [GET]\n    keys: [\"*{at}*\"]\n    allow: x\n"
                ));
            }
            text
        }),
    ]
}

#[test]
fn mutated_policies_compile_or_point_at_the_problem() {
    check(1024, mutated_policy(), |text| {
        compile_checked(&text).map(drop)
    });
}

#[test]
fn hostile_yaml_ends_in_a_bounded_result() {
    check(96, hostile(), |text| compile_checked(&text).map(drop));
}

#[test]
fn nesting_past_the_limit_is_refused_where_it_gets_too_deep() {
    check(64, 66usize..5000, |depth| {
        let text = format!("rules: {}{}", "[".repeat(depth), "]".repeat(depth));
        let diagnostics = compile_checked(&text)?;
        let first = diagnostics
            .first()
            .map(ToString::to_string)
            .unwrap_or_default();
        prop_assert!(first.contains("nesting deeper than 64 levels"), "{}", first);
        Ok(())
    });
}

#[test]
fn broken_yaml_is_an_error_with_line_and_column() {
    let breaks = proptest::sample::select(
        &[
            "key: [unclosed\n",
            "\"open\n",
            "- a\n b: c\n",
            "a: b: c\n",
            "\t- tab\n",
        ][..],
    );
    check(256, (any::<usize>(), breaks), |(at, broken)| {
        let mut lines: Vec<&str> = DEFAULT_POLICY.split_inclusive('\n').collect();
        let at = at % (lines.len() + 1);
        lines.insert(at, broken);
        let text = lines.concat();
        let diagnostics = compile_checked(&text)?;
        prop_assert!(
            diagnostics
                .iter()
                .any(|d| d.severity == compile::Severity::Error),
            "broken YAML at line {} compiled",
            at + 1
        );
        Ok(())
    });
}
