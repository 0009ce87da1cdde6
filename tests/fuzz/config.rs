//! The config parser (`tollgate::Config::parse`) on mutated configurations and hostile YAML: a
//! config or an `Invalid` error whose line and column, when given, point into the file; never a
//! panic; syntax errors always carry a line and column.

use std::path::Path;

use proptest::prelude::*;
use tollgate::config::{Config, ConfigError};

use crate::mutate::{apply, mutations};
use crate::support::check;

const SPECIALS: &[u8] = b"-:[]{}&*!|>'\"#,? \t\n0123456789smh";

/// A configuration touching most sections, as the README shows them.
const SEED: &str = "\
runtime_dir: /run/tollgate
resp:
  max_command_bytes: 67108864
  max_pipeline: 1024
  command_timeout: 10s
limits:
  max_clients: 10000
  http_header_timeout: 5s
listen:
  mode: \"0660\"
redis:
  address: unix:/run/redis/redis.sock
lanes:
  blocking:
    connections: 32
    acquire_timeout: 2s
policy:
  files: [policies/default.yaml]
  limits: { fuel: 50000000, deadline: 100ms, memory_mib: 16 }
leases:
  min_ttl: 100ms
  max_ttl: 1h
identity:
  unmapped: uid
admin:
  uids: [0, 1000]
shutdown:
  drain_timeout: 10s
";

/// Parses `text`; checks what every outcome promises and returns the error, if any.
fn parse_checked(text: &str) -> Result<Option<ConfigError>, TestCaseError> {
    let lines = text.lines().count().max(1);
    match Config::parse(Path::new("fuzz.yaml"), text) {
        Ok(_) => Ok(None),
        Err(ConfigError::Invalid(invalid)) => {
            prop_assert!(!invalid.message.is_empty());
            if let Some(line) = invalid.line {
                prop_assert!(line >= 1 && line <= lines + 1, "line {} of {}", line, lines);
                prop_assert!(invalid.column.is_some_and(|column| column >= 1));
            }
            Ok(Some(ConfigError::Invalid(invalid)))
        }
        Err(other) => Err(TestCaseError::fail(format!("parsing read a file: {other}"))),
    }
}

#[test]
fn mutated_configs_parse_or_say_where_they_are_wrong() {
    check(2048, mutations(6, SPECIALS), |mutations| {
        let text =
            String::from_utf8_lossy(&apply(SEED.as_bytes().to_vec(), &mutations)).into_owned();
        parse_checked(&text).map(drop)
    });
}

#[test]
fn hostile_configs_end_in_a_config_or_an_error_that_points_into_the_file() {
    let hostile = prop_oneof![
        (1usize..5000).prop_map(|depth| format!(
            "lanes: {}{}",
            "[".repeat(depth),
            "]".repeat(depth)
        )),
        (1usize..5000).prop_map(|depth| format!(
            "resp: {}1{}",
            "{a: ".repeat(depth),
            "}".repeat(depth)
        )),
        (1usize..12).prop_map(|levels| {
            let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
            for level in 1..=levels {
                let refs = vec![format!("*a{}", level - 1); 10].join(", ");
                text.push_str(&format!("a{level}: &a{level} [{refs}]\n"));
            }
            text
        }),
        "resp:\n  command_timeout: [0-9]{1,40}(ns|ms|s|m|h|d|y|)",
        "limits:\n  max_clients: -?[0-9]{1,40}",
    ];
    check(256, hostile, |text| parse_checked(&text).map(drop));
}

#[test]
fn broken_yaml_is_an_error_with_line_and_column() {
    let breaks =
        proptest::sample::select(&["key: [unclosed\n", "\"open\n", "a: b: c\n", "\t- tab\n"][..]);
    check(256, (any::<usize>(), breaks), |(at, broken)| {
        let mut lines: Vec<&str> = SEED.split_inclusive('\n').collect();
        let at = at % (lines.len() + 1);
        lines.insert(at, broken);
        match parse_checked(&lines.concat())? {
            Some(ConfigError::Invalid(invalid)) => {
                prop_assert!(
                    invalid.line.is_some(),
                    "no line for a syntax error: {}",
                    invalid
                )
            }
            other => return Err(TestCaseError::fail(format!("broken YAML gave {other:?}"))),
        }
        Ok(())
    });
}
