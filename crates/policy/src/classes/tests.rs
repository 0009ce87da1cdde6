//! Diffs of hand-written policy pairs with known changes, the empty diffs, and the property that
//! every request, judged by the evaluator itself, decides as the class the space puts it in.

use std::sync::Arc;

use tollgate_model::Caller;

use super::diff::{diff, Change, Diff};
use super::generated::{self, Draw};
use super::{Space, Verdict, LEASE};
use crate::decision::{lane_from_wit, Decision, Descriptor};
use crate::generation::Generation;

fn generation(yaml: &str) -> Arc<Generation> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, yaml).unwrap();
    example(&path)
}

fn example(path: &std::path::Path) -> Arc<Generation> {
    generated::load(path)
}

fn repo(path: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

/// (change, principal label, witness command, keys, old, new) of a changed class.
type Summary = (Change, String, String, String, String, String);

fn rows(diff: &Diff) -> Vec<Summary> {
    diff.rows
        .iter()
        .map(|r| {
            (
                r.change,
                r.principal.clone(),
                r.witness.command.clone(),
                r.keys.clone(),
                r.old.to_string(),
                r.new.to_string(),
            )
        })
        .collect()
}

const BASE: &str = "
principals:
  app: { uids: [1000] }
rules:
  - id: app-read
    principals: [app]
    commands: [GET, MGET]
    keys: ['app:*']
    allow: reads its keys
  - id: jobs
    principals: [app]
    leases: ['jobs:*']
    allow: its jobs
";

#[test]
fn a_policy_diffed_with_itself_changes_nothing() {
    for path in ["policies/default.yaml", "policies/examples/tenants.yaml"] {
        let g = example(&repo(path));
        let same = diff(&g, &g);
        assert!(!same.changed(), "{path}: {:?}", rows(&same));
        assert!(same.complete && same.classes > 0);
    }
}

#[test]
fn reordering_rules_that_do_not_overlap_changes_nothing() {
    let swapped = "
principals:
  app: { uids: [1000] }
rules:
  - id: jobs
    principals: [app]
    leases: ['jobs:*']
    allow: its jobs
  - id: app-read
    principals: [app]
    commands: [GET, MGET]
    keys: ['app:*']
    allow: reads its keys
";
    assert!(!diff(&generation(BASE), &generation(swapped)).changed());
}

#[test]
fn a_narrowed_glob_denies_exactly_the_keys_it_gave_up() {
    let narrowed = BASE.replace("keys: ['app:*']", "keys: ['app:public:*']");
    let changed = diff(&generation(BASE), &generation(&narrowed));
    let got = rows(&changed);
    let deny = |command: &str, keys: &str| {
        (
            Change::NewlyDenied,
            "app (uid 1000)".to_owned(),
            command.to_owned(),
            keys.to_owned(),
            "allow app-read".to_owned(),
            "deny default-deny".to_owned(),
        )
    };
    // GET and MGET are two command classes (MGET names several keys). Of MGET, a kept key beside
    // a dropped one is denied as the dropped one alone is: all keys must match either way, so
    // they are one class.
    assert_eq!(
        got,
        [deny("GET", "app:x"), deny("MGET", "app:x")],
        "{}",
        changed.render("explain", true)
    );
    assert_eq!(changed.newly_denied, 2);
    for row in &changed.rows {
        assert!(row.witness.argv.is_some(), "{row:?}");
    }
}

#[test]
fn an_added_principal_is_the_peer_it_maps_and_nothing_else() {
    let added = BASE.replace(
        "  app: { uids: [1000] }\n",
        "  app: { uids: [1000] }\n  ops: { uids: [1001] }\n",
    )
        + "  - id: ops-info\n    principals: [ops]\n    commands: [INFO]\n    allow: diagnostics\n";
    let changed = diff(&generation(BASE), &generation(&added));
    let got = rows(&changed);
    assert_eq!(
        got,
        [(
            Change::NewlyAllowed,
            "(unmapped) -> ops (uid 1001)".to_owned(),
            "INFO".to_owned(),
            "-".to_owned(),
            "deny default-deny".to_owned(),
            "allow ops-info".to_owned(),
        )],
        "{}",
        changed.render("explain", true)
    );
    assert_eq!(changed.rows[0].witness.uid, 1001);
    assert_eq!(changed.rows[0].witness.principals, ["uid:1001", "ops"]);
}

#[test]
fn an_inserted_deny_rule_decides_the_classes_it_takes_over() {
    let inserted = BASE.replace(
        "rules:\n",
        "rules:\n  - id: no-secrets\n    principals: [app]\n    commands: [GET, MGET]\n    keys: ['app:secret:*']\n    deny: secret\n",
    );
    let changed = diff(&generation(BASE), &generation(&inserted));
    let got = rows(&changed);
    let secret = |keys: &str| {
        (
            Change::OtherRule,
            "app (uid 1000)".to_owned(),
            "GET".to_owned(),
            keys.to_owned(),
            "allow app-read".to_owned(),
            "deny no-secrets".to_owned(),
        )
    };
    let text = changed.render("explain", true);
    // Of GET and of MGET, a secret key alone was allowed and is denied now.
    let newly: Vec<_> = got.iter().filter(|r| r.0 == Change::NewlyDenied).collect();
    assert_eq!(newly.len(), 2, "{text}");
    assert!(
        got.contains(&secret("app:secret:x").with(Change::NewlyDenied)),
        "{text}"
    );
    // Of MGET, a secret key beside a key nobody grants (or the reserved keyspace) was already
    // refused: now by the new rule.
    for (change, principal, command, keys, old, new) in &got {
        assert_eq!(principal, "app (uid 1000)");
        assert!(keys.contains("app:secret:"), "{text}");
        assert_eq!(new, "deny no-secrets");
        match change {
            Change::NewlyDenied => assert_eq!(old, "allow app-read"),
            Change::OtherRule => {
                assert_eq!(command, "MGET", "{text}");
                assert_ne!(old, "allow app-read");
            }
            Change::NewlyAllowed => panic!("{text}"),
        }
    }
    assert_eq!(changed.newly_allowed, 0);
}

trait WithChange {
    fn with(self, change: Change) -> Self;
}

impl WithChange for Summary {
    fn with(mut self, change: Change) -> Self {
        self.0 = change;
        self
    }
}

#[test]
fn a_widened_category_allows_its_new_commands() {
    let before = "rules:\n  - id: reads\n    commands: ['@read']\n    allow: reads\n";
    let after = "rules:\n  - id: reads\n    commands: ['@read', '@write']\n    allow: reads\n";
    let (old, new) = (generation(before), generation(after));
    let changed = diff(&old, &new);
    assert!(changed.changed());
    assert_eq!(changed.newly_denied, 0);
    // Allowed now, except keys in the daemon's reserved keyspace and the commands that reach it
    // (SWAPDB): refused still, by the host.
    for row in &changed.rows {
        assert_eq!(row.old.rule, "default-deny");
        match row.change {
            Change::NewlyAllowed => assert_eq!(row.new.rule, "reads"),
            _ => {
                assert_eq!(row.new.rule, "reserved");
                assert!(
                    row.keys.contains("tollgate:") || row.commands.contains(&"SWAPDB".into()),
                    "{row:?}"
                );
            }
        }
    }
    let commands: Vec<&String> = changed
        .rows
        .iter()
        .filter(|r| r.change == Change::NewlyAllowed)
        .flat_map(|r| &r.commands)
        .collect();
    for write in ["SET", "DEL", "HSET", "LPUSH"] {
        assert!(commands.iter().any(|c| *c == write), "{write}");
    }
    // No command already in @read is among them.
    assert!(!commands.iter().any(|c| *c == "GET" || *c == "MGET"));
}

#[test]
fn a_changed_lease_rule_changes_lease_classes_only() {
    let nightly = BASE.replace("leases: ['jobs:*']", "leases: ['jobs:nightly:*']");
    let changed = diff(&generation(BASE), &generation(&nightly));
    assert_eq!(
        rows(&changed),
        [(
            Change::NewlyDenied,
            "app (uid 1000)".to_owned(),
            LEASE.to_owned(),
            "jobs:x".to_owned(),
            "allow jobs".to_owned(),
            "deny default-deny".to_owned(),
        )]
    );
}

/// A key: random bytes, or a glob's witness changed at an edge (cut short, one byte more, one
/// byte changed).
fn key(draw: &mut Draw, near: &[Vec<u8>]) -> Vec<u8> {
    const BYTES: &[u8] = b"ax:*?[]\\-_0tollgate";
    if near.is_empty() || draw.below(3) == 0 {
        let len = draw.below(8);
        return (0..len).map(|_| BYTES[draw.below(BYTES.len())]).collect();
    }
    let mut key = near[draw.below(near.len())].clone();
    match draw.below(4) {
        0 if !key.is_empty() => {
            key.truncate(draw.below(key.len()));
        }
        1 => key.push(BYTES[draw.below(BYTES.len())]),
        2 if !key.is_empty() => {
            let at = draw.below(key.len());
            key[at] = BYTES[draw.below(BYTES.len())];
        }
        _ => {}
    }
    key
}

fn decided(decision: &Decision) -> (bool, String) {
    match decision {
        Decision::Admitted { rule, .. } => (true, rule.to_string()),
        Decision::Denied(denial) => (false, denial.rule.clone()),
    }
}

/// Draws `draws` requests and checks each against its class under every generation.
fn every_request_decides_as_its_class(generations: &[&Generation], seed: u64, draws: usize) {
    let space = Space::new(generations);
    assert!(space.complete());
    let mut draw = Draw(seed);
    let near: Vec<Vec<u8>> = space
        .classes
        .iter()
        .flat_map(|c| c.witness.keys.iter().map(|k| k.as_bytes().to_vec()))
        .collect();
    let mut uids: Vec<u32> = space.principals.iter().map(|p| p.uid).collect();
    uids.push(7);
    let mut gids: Vec<u32> = space.principals.iter().map(|p| p.gid).collect();
    gids.push(7);
    let variants: Vec<_> = space
        .commands
        .iter()
        .flat_map(|c| &c.members)
        .filter(|m| !m.forms.is_empty())
        .collect();
    let mut checked = 0;
    for _ in 0..draws {
        let uid = uids[draw.below(uids.len())];
        let gid = gids[draw.below(gids.len())];
        let count = 1 + draw.below(3);
        let keys: Vec<Vec<u8>> = (0..count).map(|_| key(&mut draw, &near)).collect();
        let lease = draw.below(10) == 0;
        let (argv, name, lane, request_keys) = if lease {
            (
                None,
                LEASE.to_owned(),
                tollgate_model::Lane::Regular,
                vec![keys[0].clone()],
            )
        } else {
            let variant = variants[draw.below(variants.len())];
            let keys = if draw.below(8) == 0 { Vec::new() } else { keys };
            let one = keys.first().cloned().into_iter().collect::<Vec<_>>();
            let Some(argv) = variant
                .argv(generations[0], &keys)
                .or_else(|| variant.argv(generations[0], &one))
            else {
                continue;
            };
            let described = generations[0].describe_any_arity(&argv).unwrap();
            let found: Vec<Vec<u8>> = Descriptor::from(&described)
                .named(&argv)
                .into_iter()
                .cloned()
                .collect();
            (
                Some(argv),
                described.name,
                lane_from_wit(described.lane),
                found,
            )
        };
        let keys_ref: Vec<&[u8]> = request_keys.iter().map(Vec::as_slice).collect();
        let class = space
            .class_of(uid, gid, &name, lane, &keys_ref)
            .unwrap_or_else(|| panic!("no class for {name} {request_keys:?}"));
        for (at, g) in generations.iter().enumerate() {
            let caller = Caller {
                principal: g
                    .principal_for(uid, gid)
                    .unwrap_or_else(|| format!("uid:{uid}")),
                uid,
                gid,
                pid: 0,
            };
            let decision = match &argv {
                Some(argv) => g.admit(&caller, argv),
                None => g.admit_lease(&caller, &String::from_utf8_lossy(&request_keys[0])),
            };
            let expected: &Verdict = &class.verdicts[at];
            assert_eq!(
                decided(&decision),
                (expected.allowed, expected.rule.clone()),
                "{name} {:?} as {} under generation {at}: class witness {:?}",
                request_keys
                    .iter()
                    .map(|k| String::from_utf8_lossy(k).into_owned())
                    .collect::<Vec<_>>(),
                caller.principal,
                class.witness
            );
        }
        checked += 1;
    }
    assert!(
        checked > draws / 2,
        "only {checked} requests could be built"
    );
}

#[test]
fn random_requests_decide_as_their_class_under_the_example_policies() {
    let default = example(&repo("policies/default.yaml"));
    let tenants = example(&repo("policies/examples/tenants.yaml"));
    let read_only = example(&repo("policies/examples/read-only.yaml"));
    every_request_decides_as_its_class(&[&default, &tenants], 0x5eed_0001, 600);
    every_request_decides_as_its_class(&[&read_only, &tenants], 0x5eed_0002, 600);
}

#[test]
fn random_requests_decide_as_their_class_under_generated_policies() {
    for seed in [11, 12] {
        let old = generation(&generated::policy(seed, 40, 6));
        let new = generation(&generated::policy(seed + 100, 40, 6));
        every_request_decides_as_its_class(&[&old, &new], seed, 500);
    }
}

/// The plan and the JSON of a real change, as insta snapshots in snapshots/ (reviewed like the
/// decision tables).
#[test]
fn the_plan_and_its_json_have_reviewed_snapshots() {
    let old = example(&repo("policies/default.yaml"));
    let new = example(&repo("policies/examples/read-only.yaml"));
    let changed = diff(&old, &new);
    assert!(changed.changed());
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(repo("snapshots"));
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    settings.bind(|| {
        insta::assert_snapshot!(
            "diff__default__read-only",
            changed.render(
                "tollgate policy explain --policy policies/default.yaml --against policies/examples/read-only.yaml",
                false
            )
        );
        insta::assert_snapshot!(
            "diff__default__read-only.json",
            serde_json::to_string_pretty(&changed).unwrap()
        );
    });
}

/// Each row of the plan is a product of principal classes × command classes × key conditions,
/// every class of which changed alike, and every changed class is in exactly one row.
fn the_plan_folds_exactly(changed: &Diff) {
    let mut seen = vec![0; changed.rows.len()];
    for fold in &changed.plan {
        assert_eq!(
            fold.rows.len(),
            fold.principals.len() * fold.commands.len() * fold.keys.len(),
            "{fold:?}"
        );
        for &i in &fold.rows {
            seen[i] += 1;
            let row = &changed.rows[i];
            assert_eq!((&row.old, &row.new), (&fold.old, &fold.new), "{fold:?}");
            let peer = changed
                .peers
                .iter()
                .find(|p| p.label == row.principal)
                .unwrap();
            assert!(fold.principals.contains(&peer.name), "{fold:?}");
            assert!(fold.commands.contains(&row.commands[0]), "{fold:?}");
        }
        assert_eq!(
            fold.witness.replay(),
            changed.rows[fold.rows[0]].witness.replay()
        );
    }
    assert!(seen.iter().all(|&n| n == 1), "{seen:?}");
}

#[test]
fn the_plan_of_a_real_change_fits_a_screen_and_folds_exactly() {
    let old = example(&repo("policies/default.yaml"));
    let new = example(&repo("policies/examples/read-only.yaml"));
    let changed = diff(&old, &new);
    the_plan_folds_exactly(&changed);
    let plan = changed.render("explain", false);
    assert!(plan.lines().count() <= 40, "{plan}");
    // The classes still denied by default or by the host come last, on their own.
    let quiet = plan
        .split_once("\nstill denied by default or by the host")
        .map(|(_, rest)| rest)
        .unwrap_or_else(|| panic!("{plan}"));
    assert!(quiet.contains("reserved -> default-deny"), "{plan}");
    assert!(!quiet.contains("\nnow "), "{plan}");
    // --classes: a line per changed class.
    let every = changed.render("explain", true);
    let rows = every.lines().filter(|l| l.contains(" e.g. ")).count();
    assert_eq!(rows, changed.rows.len(), "{every}");
    for seed in [21, 22] {
        let old = generation(&generated::policy(seed, 60, 6));
        let new = generation(&generated::policy(seed + 100, 60, 6));
        the_plan_folds_exactly(&diff(&old, &new));
    }
}

/// Every catalog command on every lane it takes has a form to replay, and one that names keys
/// when it can name any (XREAD's keys follow STREAMS).
#[test]
fn every_command_has_a_form_and_a_keyed_one_when_it_names_keys() {
    let g = example(&repo("policies/default.yaml"));
    let missing: Vec<String> = super::commands::variants(&g)
        .iter()
        .filter(|v| {
            v.forms.is_empty() || (v.shape.max > 0 && v.forms.iter().all(|f| f.keys.is_empty()))
        })
        .map(|v| format!("{}@{}", v.name, v.lane.as_str()))
        .collect();
    assert!(missing.is_empty(), "{missing:?}");
    let xread = |lane| {
        super::commands::variants(&g)
            .into_iter()
            .find(|v| v.name == "XREAD" && v.lane == lane)
            .unwrap()
    };
    let keys = [b"s:1".to_vec(), b"s:2".to_vec()];
    let regular = xread(tollgate_model::Lane::Regular)
        .argv(&g, &keys)
        .unwrap();
    for word in [&b"STREAMS"[..], &keys[0], &keys[1]] {
        assert!(regular.iter().any(|a| a == word), "{regular:?}");
    }
    let blocking = xread(tollgate_model::Lane::Blocking)
        .argv(&g, &keys[..1])
        .unwrap();
    assert!(blocking.contains(&b"BLOCK".to_vec()), "{blocking:?}");
}
