//! The real kubectl, as a subprocess, against the double over TLS with a kubeconfig.
//! Skipped (loudly) only when no kubectl binary exists.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use margay_apiserver::{ApiServer, Gvr, ServerOptions};
use serde_json::{Value, json};

fn kubectl_bin() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("kubectl"))
        .find(|p| p.is_file())
}

/// One server, a kubeconfig for it and a fresh discovery cache (kubectl caches discovery per
/// host:port for hours; a reused port must not see another server's resources).
struct Kc {
    bin: PathBuf,
    server: ApiServer,
    dir: tempfile::TempDir,
}

impl Kc {
    fn new(opts: ServerOptions) -> Option<Kc> {
        let Some(bin) = kubectl_bin() else {
            eprintln!("SKIPPED: no kubectl binary on PATH (install Debian's kubernetes-client)");
            return None;
        };
        let server = ApiServer::start(opts).unwrap();
        let dir = tempfile::tempdir().unwrap();
        server
            .write_kubeconfig(&dir.path().join("kubeconfig"))
            .unwrap();
        Some(Kc { bin, server, dir })
    }

    fn calico() -> Option<Kc> {
        Kc::new(ServerOptions {
            calico_crds: true,
            ..Default::default()
        })
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("--kubeconfig")
            .arg(self.dir.path().join("kubeconfig"))
            .arg("--cache-dir")
            .arg(self.dir.path().join("cache"))
            .args(args)
            .env("HOME", self.dir.path())
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null());
        c
    }

    /// Runs kubectl (60 s at most); returns (success, stdout, stderr).
    fn run(&self, args: &[&str]) -> (bool, String, String) {
        let mut child = self
            .cmd(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(_status) = child.try_wait().unwrap() {
                let out = child.wait_with_output().unwrap();
                return (
                    out.status.success(),
                    String::from_utf8_lossy(&out.stdout).into(),
                    String::from_utf8_lossy(&out.stderr).into(),
                );
            }
            if Instant::now() > end {
                let _ = child.kill();
                let out = child.wait_with_output().unwrap();
                panic!(
                    "kubectl {args:?} timed out: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.run(args);
        assert!(ok, "kubectl {args:?} failed: {err}\n{out}");
        out
    }

    fn fail(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.run(args);
        assert!(!ok, "kubectl {args:?} should fail: {out}");
        err
    }

    fn file(&self, name: &str, text: &str) -> String {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_string_lossy().into_owned()
    }

    fn store(&self) -> margay_apiserver::StoreHandle {
        self.server.store()
    }
}

/// A background `kubectl get -w` whose output lines arrive on a channel; killed on drop.
struct Watching {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Watching {
    fn start(kc: &Kc, args: &[&str]) -> Watching {
        let mut child = kc
            .cmd(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Watching { child, lines: rx }
    }

    /// Lines until one contains `needle` (20 s at most).
    fn wait_for(&self, needle: &str) -> Vec<String> {
        let end = Instant::now() + Duration::from_secs(20);
        let mut seen = Vec::new();
        while Instant::now() < end {
            match self.lines.recv_timeout(Duration::from_millis(100)) {
                Ok(l) => {
                    let hit = l.contains(needle);
                    seen.push(l);
                    if hit {
                        return seen;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        panic!("no line with {needle:?}; saw {seen:?}");
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const POD: &str = "apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: x
  labels: {app: web}
spec:
  containers:
  - name: c
    image: busybox:1
    args: [sleep, '100']
    ports:
    - containerPort: 80
      name: http
  - name: side
    image: nginx
";

fn seed(kc: &Kc) {
    let s = kc.store();
    s.create(
        Gvr::core("namespaces"),
        "",
        json!({"metadata": {"name": "x"}}),
    )
    .unwrap();
    s.create(
        Gvr::core("namespaces"),
        "",
        json!({"metadata": {"name": "y"}}),
    )
    .unwrap();
    s.create(
        Gvr::core("pods"),
        "x",
        common::pod("a", json!({"app": "web"})),
    )
    .unwrap();
    s.create(
        Gvr::core("pods"),
        "x",
        common::pod("b", json!({"app": "db"})),
    )
    .unwrap();
    s.create(
        Gvr::core("pods"),
        "y",
        common::pod("c", json!({"app": "web"})),
    )
    .unwrap();
    s.create(Gvr::core("nodes"), "", json!({"metadata": {"name": "node-1", "labels": {"node-role.kubernetes.io/control-plane": ""}}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}})).unwrap();
}

#[test]
fn get_in_every_output_form() {
    let Some(kc) = Kc::new(ServerOptions::default()) else {
        return;
    };
    seed(&kc);
    let out = kc.ok(&["get", "pods", "-n", "x"]);
    assert!(out.starts_with("NAME"), "{out}");
    assert!(
        out.contains("a ") && out.contains("b ") && !out.contains("c "),
        "{out}"
    );
    assert!(out.contains("Pending"), "{out}");
    let out = kc.ok(&["get", "po", "-A"]);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("NAMESPACE"), "{out}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("y ") && l.contains(" c ")),
        "namespace column filled from row metadata: {out}"
    );
    let out = kc.ok(&["get", "pods", "-n", "x", "-o", "name"]);
    assert_eq!(out, "pod/a\npod/b\n");
    let out = kc.ok(&["get", "pods", "-A", "-l", "app=web", "-o", "name"]);
    assert_eq!(out, "pod/a\npod/c\n");
    let out = kc.ok(&[
        "get",
        "pods",
        "-A",
        "-l",
        "app in (db),app!=web",
        "-o",
        "name",
    ]);
    assert_eq!(out, "pod/b\n");
    let out = kc.ok(&["get", "pods", "-n", "x", "a", "-o", "json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["metadata"]["name"], "a");
    assert_eq!(v["kind"], "Pod");
    let out = kc.ok(&["get", "pods", "-n", "x", "-o", "json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["items"].as_array().unwrap().len(), 2);
    let out = kc.ok(&["get", "pod", "b", "-n", "x", "-o", "yaml"]);
    assert!(out.contains("name: b") && out.contains("app: db"), "{out}");
    let out = kc.ok(&[
        "get",
        "pod",
        "a",
        "-n",
        "x",
        "-o",
        "jsonpath={.metadata.labels}",
    ]);
    assert_eq!(out, "{\"app\":\"web\"}");
    let out = kc.ok(&["get", "no"]);
    assert!(
        out.contains("node-1") && out.contains("Ready") && out.contains("control-plane"),
        "{out}"
    );
    let out = kc.ok(&["get", "ns"]);
    assert!(
        out.contains("kube-system") && out.contains("Active"),
        "{out}"
    );
    let out = kc.ok(&["get", "all", "-n", "x", "-o", "name"]);
    assert!(
        out.contains("pod/a"),
        "categories: all includes pods: {out}"
    );
    // Paging: more objects than kubectl's page (500).
    let s = kc.store();
    s.create(
        Gvr::core("namespaces"),
        "",
        json!({"metadata": {"name": "many"}}),
    )
    .unwrap();
    s.create_many(
        Gvr::core("configmaps"),
        "many",
        (0..1203).map(|i| json!({"metadata": {"name": format!("cm-{i:04}")}})),
    )
    .unwrap();
    let out = kc.ok(&["get", "cm", "-n", "many", "-o", "name"]);
    assert_eq!(out.lines().count(), 1203);
    let out = kc.ok(&["get", "pods", "-n", "kube-public"]);
    assert!(out.is_empty());
    let (_, _, err) = kc.run(&["get", "pods", "-n", "kube-public"]);
    assert!(
        err.contains("No resources found in kube-public namespace."),
        "{err}"
    );
    // Discovery of `version` (the dispatcher's minor 32 keeps it on its built-in kubectl).
    let out = kc.ok(&["version", "-o", "json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["serverVersion"]["minor"], "32");
}

#[test]
fn errors_print_as_kubectl_prints_them() {
    let Some(kc) = Kc::new(ServerOptions::default()) else {
        return;
    };
    seed(&kc);
    let err = kc.fail(&["get", "pod", "nope", "-n", "x"]);
    assert!(
        err.contains("Error from server (NotFound): pods \"nope\" not found"),
        "{err}"
    );
    let err = kc.fail(&["get", "pod", "nope", "-n", "nons"]);
    assert!(
        err.contains("Error from server (NotFound): namespaces \"nons\" not found"),
        "{err}"
    );
    let f = kc.file("pod.yaml", POD);
    kc.ok(&["create", "-f", &f]);
    let err = kc.fail(&["create", "-f", &f]);
    assert!(err.contains(&format!("Error from server (AlreadyExists): error when creating \"{f}\": pods \"web\" already exists")), "{err}");
    let bad = kc.file("bad.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: bad, namespace: x}\nspec:\n  containers:\n  - name: c\n");
    let err = kc.fail(&["create", "-f", &bad]);
    assert!(
        err.contains("The Pod \"bad\" is invalid: spec.containers[0].image: Required value"),
        "{err}"
    );
    let err = kc.fail(&["get", "frobnicators"]);
    assert!(
        err.contains("the server doesn't have a resource type \"frobnicators\""),
        "{err}"
    );
    let err = kc.fail(&["delete", "pod", "p6", "-n", "x"]);
    assert!(
        err.contains("Error from server (NotFound): pods \"p6\" not found"),
        "{err}"
    );
    // A wrong token.
    let cfg = kc
        .server
        .kubeconfig_yaml()
        .replace(kc.server.token(), "wrong");
    std::fs::write(kc.dir.path().join("kubeconfig"), cfg).unwrap();
    let err = kc.fail(&["get", "pods"]);
    assert!(
        err.contains("error: You must be logged in to the server (Unauthorized)"),
        "{err}"
    );
}

#[test]
fn create_apply_twice_and_server_side_apply() {
    let Some(kc) = Kc::calico() else { return };
    seed(&kc);
    let f = kc.file("pod.yaml", POD);
    assert_eq!(kc.ok(&["apply", "-f", &f]), "pod/web created\n");
    assert_eq!(kc.ok(&["apply", "-f", &f]), "pod/web unchanged\n");
    // Change the image, drop the sidecar: a strategic merge patch that must keep ports.
    let changed = POD
        .replace("busybox:1", "busybox:2")
        .replace("  - name: side\n    image: nginx\n", "");
    std::fs::write(&f, changed).unwrap();
    assert_eq!(kc.ok(&["apply", "-f", &f]), "pod/web configured\n");
    let p = kc.store().get(Gvr::core("pods"), "x", "web").unwrap();
    let cs = p["spec"]["containers"].as_array().unwrap();
    assert_eq!(cs.len(), 1, "the removed container is gone: {cs:?}");
    assert_eq!(cs[0]["image"], "busybox:2");
    assert_eq!(
        cs[0]["ports"],
        json!([{"containerPort": 80, "name": "http"}]),
        "ports survive the strategic merge"
    );
    assert_eq!(cs[0]["args"], json!(["sleep", "100"]));
    assert!(
        p["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .as_str()
            .unwrap()
            .contains("busybox:2")
    );

    // A custom resource: merge patch, removed fields deleted.
    let pool = "apiVersion: crd.projectcalico.org/v1\nkind: IPPool\nmetadata:\n  name: pool1\nspec:\n  cidr: 10.0.0.0/16\n  natOutgoing: true\n";
    let pf = kc.file("pool.yaml", pool);
    assert_eq!(
        kc.ok(&["apply", "-f", &pf]),
        "ippool.crd.projectcalico.org/pool1 created\n"
    );
    std::fs::write(
        &pf,
        pool.replace("  natOutgoing: true\n", "  blockSize: 26\n"),
    )
    .unwrap();
    assert_eq!(
        kc.ok(&["apply", "-f", &pf]),
        "ippool.crd.projectcalico.org/pool1 configured\n"
    );
    let v = kc.store().get(Gvr::calico("ippools"), "", "pool1").unwrap();
    assert_eq!(v["spec"], json!({"cidr": "10.0.0.0/16", "blockSize": 26}));
    assert_eq!(v["metadata"]["generation"], 2);

    // Server-side apply: create, then update; both print serverside-applied.
    let np = "apiVersion: crd.projectcalico.org/v1\nkind: NetworkPolicy\nmetadata:\n  name: allow\n  namespace: x\nspec:\n  selector: all()\n  ingress:\n  - action: Allow\n";
    let nf = kc.file("np.yaml", np);
    assert_eq!(
        kc.ok(&["apply", "--server-side", "-f", &nf]),
        "networkpolicy.crd.projectcalico.org/allow serverside-applied\n"
    );
    std::fs::write(&nf, np.replace("all()", "app == 'web'")).unwrap();
    assert_eq!(
        kc.ok(&["apply", "--server-side", "--force-conflicts", "-f", &nf]),
        "networkpolicy.crd.projectcalico.org/allow serverside-applied\n"
    );
    let v = kc
        .store()
        .get(Gvr::calico("networkpolicies"), "x", "allow")
        .unwrap();
    assert_eq!(v["spec"]["selector"], "app == 'web'");
    // Server dry run writes nothing.
    let dry = kc.file("dry.yaml", &POD.replace("name: web", "name: dry"));
    let out = kc.ok(&["apply", "--dry-run=server", "-f", &dry]);
    assert!(out.contains("(server dry run)"), "{out}");
    assert_eq!(
        kc.store()
            .get(Gvr::core("pods"), "x", "dry")
            .unwrap_err()
            .code,
        404
    );
    // `get networkpolicies` resolves to networking.k8s.io (built-in groups come first).
    kc.store()
        .create(
            Gvr::new("networking.k8s.io", "v1", "networkpolicies"),
            "x",
            json!({"metadata": {"name": "k8s-np"}, "spec": {"podSelector": {}}}),
        )
        .unwrap();
    assert_eq!(
        kc.ok(&["get", "networkpolicies", "-n", "x", "-o", "name"]),
        "networkpolicy.networking.k8s.io/k8s-np\n"
    );
    assert_eq!(
        kc.ok(&["get", "netpol", "-n", "x", "-o", "name"]),
        "networkpolicy.networking.k8s.io/k8s-np\n"
    );
    assert_eq!(
        kc.ok(&[
            "get",
            "networkpolicies.crd.projectcalico.org",
            "-n",
            "x",
            "-o",
            "name"
        ]),
        "networkpolicy.crd.projectcalico.org/allow\n"
    );
    assert_eq!(
        kc.ok(&["get", "ippools.crd.projectcalico.org", "-o", "name"]),
        "ippool.crd.projectcalico.org/pool1\n"
    );
}

#[test]
fn label_annotate_patch() {
    let Some(kc) = Kc::calico() else { return };
    seed(&kc);
    assert_eq!(
        kc.ok(&["label", "pod", "a", "-n", "x", "color=red"]),
        "pod/a labeled\n"
    );
    assert_eq!(
        kc.ok(&["annotate", "pod", "a", "-n", "x", "note=hi"]),
        "pod/a annotated\n"
    );
    let p = kc.store().get(Gvr::core("pods"), "x", "a").unwrap();
    assert_eq!(
        p["metadata"]["labels"],
        json!({"app": "web", "color": "red"})
    );
    assert_eq!(p["metadata"]["annotations"], json!({"note": "hi"}));
    kc.fail(&["label", "pod", "a", "-n", "x", "color=blue"]);
    kc.ok(&["label", "pod", "a", "-n", "x", "color=blue", "--overwrite"]);
    kc.ok(&["label", "pod", "a", "-n", "x", "app-"]);
    let p = kc.store().get(Gvr::core("pods"), "x", "a").unwrap();
    assert_eq!(p["metadata"]["labels"], json!({"color": "blue"}));
    assert_eq!(
        kc.ok(&["get", "pods", "-A", "-l", "color=blue", "-o", "name"]),
        "pod/a\n"
    );

    kc.store()
        .create(
            Gvr::calico("ippools"),
            "",
            json!({"metadata": {"name": "p"}, "spec": {"cidr": "10.1.0.0/16", "disabled": false}}),
        )
        .unwrap();
    assert_eq!(
        kc.ok(&[
            "patch",
            "ippool",
            "p",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"disabled":true,"cidr":null}}"#
        ]),
        "ippool.crd.projectcalico.org/p patched\n"
    );
    let v = kc.store().get(Gvr::calico("ippools"), "", "p").unwrap();
    assert_eq!(v["spec"], json!({"disabled": true}));
    kc.ok(&["patch", "ippool", "p", "--type", "json", "-p", r#"[{"op":"add","path":"/spec/cidr","value":"10.2.0.0/16"},{"op":"remove","path":"/spec/disabled"}]"#]);
    let v = kc.store().get(Gvr::calico("ippools"), "", "p").unwrap();
    assert_eq!(v["spec"], json!({"cidr": "10.2.0.0/16"}));
    // The default strategic patch is refused for custom resources (415), as kubectl shows.
    let err = kc.fail(&["patch", "ippool", "p", "-p", r#"{"spec":{"x":1}}"#]);
    assert!(err.contains("application/strategic-merge-patch+json is not supported by crd.projectcalico.org/v1, Kind=IPPool"), "{err}");
    // ...but works for built-in kinds, merging containers by name.
    kc.ok(&[
        "patch",
        "pod",
        "a",
        "-n",
        "x",
        "-p",
        r#"{"spec":{"containers":[{"name":"c","image":"busybox:9"}]}}"#,
    ]);
    let p = kc.store().get(Gvr::core("pods"), "x", "a").unwrap();
    assert_eq!(
        p["spec"]["containers"],
        json!([{"name": "c", "image": "busybox:9"}])
    );
    // A failing json patch test reports an error and changes nothing.
    let rv =
        kc.store().get(Gvr::calico("ippools"), "", "p").unwrap()["metadata"]["resourceVersion"]
            .clone();
    kc.fail(&[
        "patch",
        "ippool",
        "p",
        "--type",
        "json",
        "-p",
        r#"[{"op":"test","path":"/spec/cidr","value":"nope"}]"#,
    ]);
    assert_eq!(
        kc.store().get(Gvr::calico("ippools"), "", "p").unwrap()["metadata"]["resourceVersion"],
        rv
    );
}

#[test]
fn delete_waits_and_honours_finalizers() {
    let Some(kc) = Kc::new(ServerOptions::default()) else {
        return;
    };
    seed(&kc);
    assert_eq!(
        kc.ok(&["delete", "pod", "a", "-n", "x"]),
        "pod \"a\" deleted\n"
    );
    assert_eq!(
        kc.store()
            .get(Gvr::core("pods"), "x", "a")
            .unwrap_err()
            .code,
        404
    );
    let f = kc.file("pod.yaml", POD);
    kc.ok(&["create", "-f", &f]);
    assert_eq!(kc.ok(&["delete", "-f", &f]), "pod \"web\" deleted\n");
    // A finalizer: kubectl's wait sees the deletionTimestamp and watches until it is gone.
    kc.store()
        .create(
            Gvr::core("configmaps"),
            "x",
            json!({"metadata": {"name": "held", "finalizers": ["example.com/hold"]}}),
        )
        .unwrap();
    let mut child = Reaper(
        kc.cmd(&["delete", "cm", "held", "-n", "x", "--timeout=30s"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let s = kc.store();
    assert!(wait_until(Duration::from_secs(20), || s
        .get(Gvr::core("configmaps"), "x", "held")
        .is_ok_and(|c| c["metadata"]["deletionTimestamp"].is_string())));
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        child.0.try_wait().unwrap().is_none(),
        "kubectl delete waits while the finalizer holds the object"
    );
    s.patch(
        Gvr::core("configmaps"),
        "x",
        "held",
        margay_apiserver::PatchType::Merge,
        &json!({"metadata": {"finalizers": null}}),
    )
    .unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(st) = child.0.try_wait().unwrap() {
            break st;
        }
        assert!(
            Instant::now() < end,
            "kubectl delete did not finish after the finalizer went"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success());
    let mut out = String::new();
    std::io::Read::read_to_string(child.0.stdout.as_mut().unwrap(), &mut out).unwrap();
    assert_eq!(out, "configmap \"held\" deleted\n");
    // Deleting a namespace deletes what is in it.
    kc.ok(&["delete", "ns", "y"]);
    assert_eq!(
        kc.store()
            .get(Gvr::core("pods"), "y", "c")
            .unwrap_err()
            .code,
        404
    );
    // --dry-run=server deletes nothing.
    kc.ok(&["delete", "pod", "b", "-n", "x", "--dry-run=server"]);
    assert!(kc.store().get(Gvr::core("pods"), "x", "b").is_ok());
}

/// A child process killed (if still running) when the test ends, also on a failed assertion.
struct Reaper(Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_until(d: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + d;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn get_watch_sees_later_changes() {
    let Some(kc) = Kc::new(ServerOptions::default()) else {
        return;
    };
    seed(&kc);
    let w = Watching::start(&kc, &["get", "pods", "-n", "x", "-w"]);
    w.wait_for("b ");
    let s = kc.store();
    s.create(Gvr::core("pods"), "x", common::pod("late", json!({})))
        .unwrap();
    w.wait_for("late");
    s.delete(Gvr::core("pods"), "x", "a").unwrap();
    let lines = w.wait_for("a ");
    assert!(
        !lines.iter().any(|l| l.starts_with("NAME")),
        "a Table watch does not reprint headers: {lines:?}"
    );
    // A single-object watch: kubectl drops the synthetic ADDED; the first real change shows.
    let w1 = Watching::start(
        &kc,
        &[
            "get",
            "pod",
            "b",
            "-n",
            "x",
            "-w",
            "-o",
            "jsonpath={.metadata.labels.w}{\"\\n\"}",
        ],
    );
    std::thread::sleep(Duration::from_millis(1500));
    for i in 1..=2 {
        s.patch(
            Gvr::core("pods"),
            "x",
            "b",
            margay_apiserver::PatchType::Merge,
            &json!({"metadata": {"labels": {"w": i.to_string()}}}),
        )
        .unwrap();
    }
    s.patch(
        Gvr::core("pods"),
        "x",
        "late",
        margay_apiserver::PatchType::Merge,
        &json!({"metadata": {"labels": {"w": "other"}}}),
    )
    .unwrap();
    let seen = w1.wait_for("2");
    assert!(
        seen.iter().any(|l| l == "1"),
        "the first change is printed: {seen:?}"
    );
    assert!(
        !seen.iter().any(|l| l.contains("other")),
        "the field selector filters other pods: {seen:?}"
    );
}

#[test]
fn custom_resource_definitions_from_kubectl() {
    let Some(kc) = Kc::new(ServerOptions::default()) else {
        return;
    };
    let crd = "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names:
    plural: widgets
    singular: widget
    kind: Widget
    shortNames: [wd]
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
    additionalPrinterColumns:
    - name: Size
      type: integer
      jsonPath: .spec.size
";
    let f = kc.file("crd.yaml", crd);
    assert_eq!(
        kc.ok(&["apply", "-f", &f]),
        "customresourcedefinition.apiextensions.k8s.io/widgets.example.com created\n"
    );
    let out = kc.ok(&[
        "wait",
        "--for=condition=established",
        "crd/widgets.example.com",
        "--timeout=10s",
    ]);
    assert!(out.contains("condition met"), "{out}");
    let w = kc.file("w.yaml", "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w1\n  namespace: default\nspec:\n  size: 3\n");
    assert_eq!(
        kc.ok(&["apply", "-f", &w]),
        "widget.example.com/w1 created\n"
    );
    let out = kc.ok(&["get", "wd"]);
    assert!(
        out.contains("SIZE") && out.contains("w1") && out.contains('3'),
        "{out}"
    );
    assert_eq!(
        kc.ok(&["get", "widgets", "-o", "name"]),
        "widget.example.com/w1\n"
    );
    // Deleting the CRD removes its resources.
    kc.ok(&["delete", "-f", &f]);
    let err = kc.fail(&["get", "widgets.example.com", "w1", "-n", "default"]);
    assert!(
        err.contains("NotFound") || err.contains("doesn't have a resource type"),
        "{err}"
    );
}

#[test]
fn services_get_cluster_ips_and_node_ports_as_from_kube_apiserver() {
    let Some(kc) = Kc::new(ServerOptions {
        service_cidr: "10.100.0.0/16".into(),
        ..Default::default()
    }) else {
        return;
    };
    let web = kc.file(
        "web.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  type: NodePort\n  selector: {app: web}\n  ports: [{name: http, port: 80, targetPort: http}]\n",
    );
    kc.ok(&["apply", "-f", &web]);
    let out = kc.ok(&["get", "svc", "web", "--no-headers"]);
    let cols: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(
        &cols[..5],
        ["web", "NodePort", "10.100.0.1", "<none>", "80:30000/TCP"],
        "{out}"
    );
    // Applied again: the allocation stands.
    assert!(kc.ok(&["apply", "-f", &web]).contains("unchanged"));
    let headless = kc.file(
        "headless.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: db}\nspec:\n  clusterIP: None\n  ports: [{port: 5432}]\n",
    );
    kc.ok(&["apply", "-f", &headless]);
    let out = kc.ok(&["get", "svc", "db", "-o", "jsonpath={.spec.clusterIPs}"]);
    assert_eq!(out, "[\"None\"]");
    // Taken and out-of-range addresses and ports are refused as kube-apiserver refuses them.
    let dup = kc.file(
        "dup.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: dup}\nspec:\n  clusterIP: 10.100.0.1\n  ports: [{port: 80}]\n",
    );
    let err = kc.fail(&["apply", "-f", &dup]);
    assert!(
        err.contains("The Service \"dup\" is invalid: spec.clusterIPs: Invalid value: []string{\"10.100.0.1\"}: failed to allocate IP 10.100.0.1: provided IP is already allocated"),
        "{err}"
    );
    let far = kc.file(
        "far.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: far}\nspec:\n  type: NodePort\n  ports: [{port: 80, nodePort: 30000}, {port: 81, nodePort: 80}]\n",
    );
    let err = kc.fail(&["apply", "-f", &far]);
    assert!(
        err.contains(
            "spec.ports[0].nodePort: Invalid value: 30000: provided port is already allocated"
        ) && err.contains("The range of valid ports is 30000-32767"),
        "{err}"
    );
    // Deleted: its address and port are free again.
    kc.ok(&["delete", "svc", "web"]);
    let again = kc.file(
        "again.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: again}\nspec:\n  type: NodePort\n  clusterIP: 10.100.0.1\n  ports: [{port: 80, nodePort: 30000}]\n",
    );
    kc.ok(&["apply", "-f", &again]);
}

#[test]
fn survives_a_restart_on_the_same_port() {
    let Some(kc) = Kc::new(ServerOptions::default()) else {
        return;
    };
    seed(&kc);
    assert_eq!(
        kc.ok(&["get", "pods", "-n", "x", "-o", "name"]),
        "pod/a\npod/b\n"
    );
    let rv = kc.store().resource_version();
    kc.server.stop();
    let err = kc.fail(&["get", "pods", "-n", "x", "--request-timeout=5s"]);
    assert!(
        err.contains("was refused") || err.contains("connection refused"),
        "{err}"
    );
    kc.store()
        .create(Gvr::core("pods"), "x", common::pod("while-down", json!({})))
        .unwrap();
    kc.server.start_again().unwrap();
    assert_eq!(
        kc.ok(&["get", "pods", "-n", "x", "-o", "name"]),
        "pod/a\npod/b\npod/while-down\n"
    );
    let out = kc.ok(&[
        "get",
        "pod",
        "while-down",
        "-n",
        "x",
        "-o",
        "jsonpath={.metadata.resourceVersion}",
    ]);
    assert_eq!(
        out.parse::<u64>().unwrap(),
        rv + 1,
        "revisions continue across the restart"
    );
}
