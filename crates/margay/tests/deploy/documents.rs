//! 2. Every document, every command line, every variable.

use super::*;

/// Kinds that live outside namespaces.
const CLUSTER_SCOPED: &[&str] = &[
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "Namespace",
];

#[test]
fn every_document_is_a_kubernetes_object() {
    let files = manifest_files(&deploy_dir());
    assert!(files.len() >= 7, "{files:?}");
    let mut seen: BTreeMap<(String, String, String, String), String> = BTreeMap::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        assert!(
            !text.contains('\t'),
            "{}: a tab (YAML indents with spaces)",
            rel(f)
        );
        let docs = yaml_docs(&text).unwrap_or_else(|e| panic!("{}: not YAML: {e}", rel(f)));
        assert!(!docs.is_empty(), "{}: no documents", rel(f));
        for d in docs {
            let at = format!("{}: {}", rel(f), d);
            let api_version = d["apiVersion"].as_str().unwrap_or("");
            let kind = d["kind"].as_str().unwrap_or("");
            let name = d["metadata"]["name"].as_str().unwrap_or("");
            assert!(
                !api_version.is_empty() && !kind.is_empty() && !name.is_empty(),
                "apiVersion, kind and metadata.name: {at}"
            );
            let ns = d["metadata"]["namespace"].as_str().unwrap_or("");
            if CLUSTER_SCOPED.contains(&kind) {
                assert!(ns.is_empty(), "{kind} is cluster-scoped: {at}");
            } else {
                assert_eq!(ns, NAMESPACE, "margay's objects live in kube-system: {at}");
            }
            // One object per identity in an installation; the BGP DaemonSet replaces the
            // default one (a different installation).
            let key = (
                api_version.to_string(),
                kind.to_string(),
                ns.to_string(),
                name.to_string(),
            );
            let variant = rel(f).starts_with("bgp/") || rel(f).starts_with("etcd/");
            if !variant && let Some(other) = seen.insert(key, rel(f)) {
                panic!("{kind} {name} is in both {other} and {}", rel(f));
            }
        }
    }
    // The default installation has the pieces the issue asks for.
    let m = Manifests::default_set();
    for (kind, name) in [
        ("DaemonSet", "margay-node"),
        ("Deployment", "margay-typha"),
        ("Service", "margay-typha"),
        ("PodDisruptionBudget", "margay-typha"),
        ("Deployment", "margay-kube-controllers"),
        ("ConfigMap", "margay-config"),
        ("ClusterRole", "margay-node"),
        ("ClusterRole", "margay-cni-plugin"),
        ("ClusterRole", "margay-kube-controllers"),
    ] {
        m.get(kind, name);
    }
    assert_eq!(
        m.of_kind("CustomResourceDefinition").count(),
        CALICO_CRDS.len()
    );
    for (at, pod) in m.pod_specs() {
        for c in ["initContainers", "containers"] {
            for c in pod[c].as_array().into_iter().flatten() {
                assert_eq!(c["image"], IMAGE, "{at}: the documented image placeholder");
            }
        }
    }
}

#[test]
fn every_container_runs_a_margay_command_line() {
    let kube_controllers = has_role("kube-controllers");
    let bird_help = roles::run_within(
        {
            let mut c = Command::new("bird");
            c.arg("--help");
            c
        },
        WAIT,
    );
    let mut checked = 0;
    for m in [
        Manifests::default_set(),
        Manifests::bgp_set(),
        Manifests::etcd_set(),
    ] {
        for c in containers(&m) {
            let mut lines = vec![("command".to_string(), c.argv())];
            lines.extend(c.probe_argvs());
            for (what, argv) in lines {
                assert!(!argv.is_empty(), "{} {what}: no command", c.at);
                if is_margay(&argv) {
                    if argv.get(1).is_some_and(|r| r == "kube-controllers") && !kube_controllers {
                        eprintln!(
                            "NOT CHECKED: {} {what} {argv:?}: this margay has no kube-controllers role yet",
                            c.at
                        );
                        continue;
                    }
                    if let Err(e) = margay_help(&argv[1..]) {
                        panic!("{} {what}: margay does not take {argv:?}:\n{e}", c.at);
                    }
                    checked += 1;
                } else if let Some(script) = (what == "command").then(|| c.script()).flatten() {
                    // A script that ends in `exec bird …`: BIRD's own flags.
                    if let Some(line) = script
                        .lines()
                        .map(str::trim)
                        .find(|l| l.starts_with("exec bird "))
                    {
                        let help = String::from_utf8_lossy(&bird_help.stdout).into_owned()
                            + &String::from_utf8_lossy(&bird_help.stderr);
                        assert!(
                            help.contains("-c <config-file>"),
                            "no BIRD to check {line:?} against (Debian's bird2): {help}"
                        );
                        for flag in line.split_whitespace().filter(|t| t.starts_with('-')) {
                            assert!(
                                help.contains(&format!("  {flag} ")),
                                "{}: BIRD has no {flag} ({line:?}):\n{help}",
                                c.at
                            );
                        }
                        checked += 1;
                    }
                    // Other scripts run in dataplane_and_typha_run_as_deployed_within_their_rbac.
                } else {
                    panic!(
                        "{} {what}: {argv:?} is neither margay nor a shell script",
                        c.at
                    );
                }
            }
        }
    }
    assert!(checked >= 10, "only {checked} command lines checked");
}

/// Every variable margay's datastore settings read (DatastoreConfig asks for them).
fn datastore_variables() -> BTreeSet<String> {
    let asked = Mutex::new(BTreeSet::new());
    for (ty, extra) in [
        ("kubernetes", None),
        ("etcdv3", Some(("ETCD_ENDPOINTS", "http://127.0.0.1:1"))),
        ("local", Some(("DATASTORE_PATH", "/nonexistent/ds.db"))),
    ] {
        let _ = margay_datastore::DatastoreConfig::from_lookup(|k| {
            asked.lock().unwrap().insert(k.to_string());
            match k {
                "DATASTORE_TYPE" => Some(ty.to_string()),
                _ => extra.filter(|(n, _)| *n == k).map(|(_, v)| v.to_string()),
            }
        });
    }
    let asked = asked.into_inner().unwrap();
    assert!(
        asked.contains("DATASTORE_TYPE") && asked.contains("KUBECONFIG"),
        "{asked:?}"
    );
    asked
}

/// The names a help text documents: `NAME` words, and `PREFIX_*` patterns.
fn documented(help: &str) -> (BTreeSet<String>, Vec<String>) {
    let mut names = BTreeSet::new();
    let mut prefixes = Vec::new();
    for w in help
        .split(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_' || c == '*'))
    {
        if w.len() < 2 || !w.chars().any(|c| c.is_ascii_uppercase()) {
            continue;
        }
        match w.strip_suffix('*') {
            Some(p) if p.ends_with('_') => prefixes.push(p.to_string()),
            Some(_) => {}
            None => {
                names.insert(w.to_string());
            }
        }
    }
    (names, prefixes)
}

/// FELIX_* variables: each is a Felix parameter margay acts on, read from the environment
/// (`margay felix config --all --json` with exactly these variables).
fn check_felix_variables(at: &str, vars: &[(String, String)]) {
    if vars.is_empty() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let mut c = margay(home.path());
    c.args(["felix", "config", "--all", "--json", "--no-datastore", "-c"])
        .arg(home.path().join("no-felix.cfg"));
    for (k, v) in vars {
        c.env(k, v);
    }
    let o = roles::run_within(c, WAIT);
    assert!(o.status.success(), "{at}: felix config: {}", show(&o));
    let cfg: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(cfg["unknown"], json!([]), "{at}: not Felix parameters");
    assert_eq!(cfg["warnings"], json!([]), "{at}: Felix warns");
    for (k, _) in vars {
        let p = cfg["params"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["origin"] == k.as_str())
            .unwrap_or_else(|| panic!("{at}: {k} is not read as a Felix parameter"));
        assert_eq!(p["source"], "environmentVariable", "{at}: {k}: {p}");
        assert_eq!(
            p["supported"], true,
            "{at}: {k}: margay does not act on Felix's {}",
            p["name"]
        );
    }
}

/// TYPHA_* variables: each changes Typha's configuration (a value it cannot take is refused or
/// kept: an unknown parameter is ignored by Typha, so it changes nothing), and the manifest's
/// values load together.
fn check_typha_variables(at: &str, vars: &[(String, String)]) {
    use margay_typha::config::TyphaConfig;
    if vars.is_empty() {
        return;
    }
    let default = TyphaConfig::default();
    for (k, _) in vars {
        let probe = BTreeMap::from([(k.clone(), "margay-probe-value".to_string())]);
        match TyphaConfig::load(&probe, None) {
            Err(_) => {}
            Ok(c) => assert_ne!(
                c, default,
                "{at}: {k} is not a parameter margay's Typha reads"
            ),
        }
    }
    let all: BTreeMap<String, String> = vars.iter().cloned().collect();
    if let Err(e) = TyphaConfig::load(&all, None) {
        panic!("{at}: {e}");
    }
}

#[test]
fn every_variable_set_is_one_margay_reads() {
    let datastore = datastore_variables();
    let kube_controllers = has_role("kube-controllers");
    let mut checked = 0;
    for m in [
        Manifests::default_set(),
        Manifests::bgp_set(),
        Manifests::etcd_set(),
    ] {
        for c in containers(&m) {
            let env = c.env(&m).unwrap_or_else(|e| panic!("{}: {e}", c.at));
            let mut seen = BTreeSet::new();
            for (k, _) in &env {
                assert!(seen.insert(k.clone()), "{}: {k} set twice", c.at);
            }
            let argv = c.argv();
            let script = c.script();
            assert!(is_margay(&argv) || script.is_some(), "{}: {argv:?}", c.at);
            if argv.get(1).is_some_and(|r| r == "kube-controllers") && !kube_controllers {
                eprintln!(
                    "NOT CHECKED: {} environment: this margay has no kube-controllers role yet",
                    c.at
                );
                continue;
            }
            // What reads the environment: the script, or the margay command (its help, its
            // role's help), and the margay probes that run in the same container.
            let mut help = String::new();
            if is_margay(&argv) {
                // `margay <role>`, `margay <role> <command>`, …: the subcommand path.
                let path = argv[1..].iter().take_while(|a| !a.starts_with('-')).count();
                for n in 2..=path + 1 {
                    help += &margay_help(&argv[1..n]).unwrap();
                }
            }
            let mut runs_margay = is_margay(&argv);
            for (_, p) in c.probe_argvs() {
                if is_margay(&p) {
                    help += &margay_help(&p[1..]).unwrap();
                    runs_margay = true;
                }
            }
            let (names, prefixes) = documented(&help);
            let of = |prefix: &str| -> Vec<(String, String)> {
                env.iter()
                    .filter(|(k, _)| k.starts_with(prefix))
                    .cloned()
                    .collect()
            };
            check_felix_variables(&c.at, &of("FELIX_"));
            check_typha_variables(&c.at, &of("TYPHA_"));
            for (k, _) in &env {
                let in_script = script.as_ref().is_some_and(|s| {
                    s.contains(&format!("${k}")) || s.contains(&format!("${{{k}"))
                });
                let ok = in_script
                    || (runs_margay
                        && (k.starts_with("FELIX_")
                            || k.starts_with("TYPHA_")
                            || datastore.contains(k)
                            || names.contains(k)
                            || prefixes.iter().any(|p| k.starts_with(p.as_str()))));
                assert!(
                    ok,
                    "{}: {k} is read by nothing in the container: not used by its script, not a datastore variable, not documented by the --help of the margay commands it runs",
                    c.at
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 20, "only {checked} variables checked");
}
