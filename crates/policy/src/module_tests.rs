//! A guard module's own expectations (`tests.yaml` beside its source), as `tollgate module test`,
//! `policy test --module` and `policy review --module` run them: what the module must answer
//! (`admit`, `deny`, `abstain`) for a caller and a command, given the config bytes and limits it
//! will be loaded with. Each expectation is asked through `admit` and, with the others of its
//! principal, through `admit-batch`: the two must agree. A failure carries file:line.
//!
//! ```yaml
//! config: ":"                          # what config.get() returns (default: empty)
//! limits: { fuel: 50000000 }           # as a `policy.modules` entry's (default: the daemon's)
//! tests:
//!   - { principal: app, command: GET app:1, expect: abstain }
//!   - { principal: app, command: GET other:1, expect: deny, rule: key-prefix }
//! ```

use std::path::{Path, PathBuf};

use serde::Deserialize;
use tollgate_model::Caller;

use crate::compile::spans::Spans;
use crate::config::ModuleLimits;
use crate::probe::{GuardAnswer, GuardProbe};

/// A module's expectations file, read.
#[derive(Debug, Clone)]
pub struct ModuleTests {
    pub path: PathBuf,
    /// What the module's `config.get()` returns in these tests.
    pub config: String,
    pub limits: ModuleLimits,
    pub tests: Vec<ModuleExpectation>,
}

/// One expectation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleExpectation {
    pub principal: String,
    pub argv: Vec<String>,
    pub expect: Expect,
    pub rule: Option<String>,
    pub line: usize,
}

/// The verdict an expectation wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Expect {
    Admit,
    Deny,
    Abstain,
}

impl Expect {
    fn word(self) -> &'static str {
        match self {
            Expect::Admit => "admit",
            Expect::Deny => "deny",
            Expect::Abstain => "abstain",
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Source {
    #[serde(default)]
    config: String,
    #[serde(default)]
    limits: ModuleLimits,
    tests: Vec<TestSource>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TestSource {
    principal: String,
    /// A command line, split on whitespace.
    command: String,
    expect: Expect,
    rule: Option<String>,
}

/// Why an expectations file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ModuleTestsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}:{column}: {message}")]
    Invalid {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
}

/// Expectations files are short; a larger one is refused before it is parsed.
const MAX_BYTES: u64 = 1024 * 1024;

impl ModuleTests {
    pub fn read(path: &Path) -> Result<ModuleTests, ModuleTestsError> {
        let read_error = |source| ModuleTestsError::Read {
            path: path.to_owned(),
            source,
        };
        let size = std::fs::metadata(path).map_err(read_error)?.len();
        if size > MAX_BYTES {
            return Err(invalid(
                path,
                (1, 1),
                format!("{size} bytes, more than {MAX_BYTES}"),
            ));
        }
        let text = std::fs::read_to_string(path).map_err(read_error)?;
        ModuleTests::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<ModuleTests, ModuleTestsError> {
        let spans = Spans::of(text).map_err(|deep| {
            invalid(
                path,
                (deep.line, deep.column),
                "nested too deeply".to_owned(),
            )
        })?;
        let source: Source = serde_yaml::from_str(text).map_err(|error| {
            let at = error.location().map_or((1, 1), |l| (l.line(), l.column()));
            invalid(path, at, error.to_string())
        })?;
        let mut tests = Vec::with_capacity(source.tests.len());
        for (index, test) in source.tests.into_iter().enumerate() {
            let at = spans.at(&format!("tests.{index}"));
            let argv: Vec<String> = test.command.split_whitespace().map(str::to_owned).collect();
            if argv.is_empty() {
                return Err(invalid(path, at, "empty command".to_owned()));
            }
            if test.rule.is_some() && test.expect == Expect::Abstain {
                return Err(invalid(
                    path,
                    at,
                    "`rule:` names the rule of an admit or a deny; an abstain has none".to_owned(),
                ));
            }
            tests.push(ModuleExpectation {
                principal: test.principal,
                argv,
                expect: test.expect,
                rule: test.rule,
                line: at.0,
            });
        }
        Ok(ModuleTests {
            path: path.to_owned(),
            config: source.config,
            limits: source.limits,
            tests,
        })
    }

    /// Runs every expectation against `probe`: each through `admit`, then each principal's
    /// through one `admit-batch`. Returns the failures as `file:line: what happened`.
    pub fn failures(&self, probe: &GuardProbe) -> Vec<String> {
        let mut failures = Vec::new();
        let mut alone = Vec::with_capacity(self.tests.len());
        for test in &self.tests {
            let (answer, _) = probe.admit(&caller(&test.principal), &test.argv);
            if let Some(failure) = self.check(test, &answer) {
                failures.push(failure);
            }
            alone.push(answer);
        }
        let mut principals: Vec<&str> = self.tests.iter().map(|t| t.principal.as_str()).collect();
        principals.sort_unstable();
        principals.dedup();
        for principal in principals {
            let (tests, answers): (Vec<&ModuleExpectation>, Vec<&GuardAnswer>) = self
                .tests
                .iter()
                .zip(&alone)
                .filter(|(test, _)| test.principal == principal)
                .unzip();
            let argvs: Vec<&[String]> = tests.iter().map(|t| t.argv.as_slice()).collect();
            let (batched, _) = probe.admit_batch(&caller(principal), &argvs);
            for ((test, answer), batched) in tests.iter().zip(answers).zip(&batched) {
                if batched != answer {
                    failures.push(format!(
                        "{}:{}: `{}` as {}: admit-batch answered {batched}, but admit {answer} \
                         (a batch must judge each command as admit does)",
                        self.path.display(),
                        test.line,
                        test.argv.join(" "),
                        test.principal,
                    ));
                }
            }
        }
        failures
    }

    fn check(&self, test: &ModuleExpectation, answer: &GuardAnswer) -> Option<String> {
        let rule_ok = test.rule.is_none() || test.rule.as_deref() == answer.rule();
        if answer.word() == test.expect.word() && rule_ok {
            return None;
        }
        Some(format!(
            "{}:{}: `{}` as {}: expected {}{}, but the module answered {answer}",
            self.path.display(),
            test.line,
            test.argv.join(" "),
            test.principal,
            test.expect.word(),
            test.rule
                .as_ref()
                .map(|r| format!(" by rule {r}"))
                .unwrap_or_default(),
        ))
    }
}

/// The caller an expectation speaks for: the principal, with the test process's own ids.
pub fn caller(principal: &str) -> Caller {
    Caller {
        principal: principal.to_owned(),
        uid: nix::unistd::getuid().as_raw(),
        gid: nix::unistd::getgid().as_raw(),
        pid: std::process::id(),
    }
}

fn invalid(path: &Path, (line, column): (usize, usize), message: String) -> ModuleTestsError {
    ModuleTestsError::Invalid {
        path: path.to_owned(),
        line,
        column,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expectations_carry_their_lines_and_bad_ones_are_refused_with_theirs() {
        let text = "config: \".\"\ntests:\n  - { principal: app, command: GET app.1, expect: abstain }\n\n  - principal: app\n    command: DEL x\n    expect: deny\n    rule: key-prefix\n";
        let tests = ModuleTests::parse(Path::new("t.yaml"), text).unwrap();
        assert_eq!(tests.config, ".");
        let lines: Vec<usize> = tests.tests.iter().map(|t| t.line).collect();
        assert_eq!(lines, [3, 5]);
        assert_eq!(tests.tests[1].argv, ["DEL", "x"]);
        assert_eq!(tests.tests[1].rule.as_deref(), Some("key-prefix"));

        let bad = "tests:\n  - { principal: app, command: GET x, expect: maybe }\n";
        let error = ModuleTests::parse(Path::new("t.yaml"), bad).unwrap_err();
        assert!(error.to_string().starts_with("t.yaml:2:"), "{error}");
        let blank = "tests:\n  - { principal: app, command: GET x, expect: deny }\n  - { principal: app, command: '  ', expect: deny }\n";
        let error = ModuleTests::parse(Path::new("t.yaml"), blank).unwrap_err();
        assert!(error.to_string().starts_with("t.yaml:3:"), "{error}");
    }
}
