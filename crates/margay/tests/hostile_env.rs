//! Careless environments given to the real binary: a value that is not UTF-8 is skipped and
//! named (never a panic, exit code 101), and etcd credentials over plain http are warned about.
#![allow(clippy::unwrap_used)] // a panic in a test is a failure with a location

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use assert_cmd::Command;

fn margay() -> Command {
    let mut c = Command::cargo_bin("margay").expect("margay binary");
    c.timeout(Duration::from_secs(60));
    c
}

fn not_utf8() -> &'static OsStr {
    OsStr::from_bytes(b"bad\xff")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn felix_config_skips_and_names_variables_that_are_not_utf8() {
    let dir = tempfile::tempdir().unwrap();
    let out = margay()
        .args(["felix", "config", "--no-datastore", "-c"])
        .arg(dir.path().join("absent.cfg"))
        .env("FELIX_LOGSEVERITYSCREEN", not_utf8())
        .env("SOMETHING_ELSE", not_utf8())
        .env("FELIX_HEALTHENABLED", "true")
        .output()
        .unwrap();
    let err = text(&out.stderr);
    // Before: std::env::vars() panicked (exit 101).
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("FELIX_LOGSEVERITYSCREEN")
            && err.contains("SOMETHING_ELSE")
            && err.contains("not UTF-8"),
        "{err}"
    );
    // The rest of the environment still counts.
    assert!(text(&out.stdout).contains("FELIX_HEALTHENABLED"));
}

#[test]
fn confd_names_a_node_name_that_is_not_utf8() {
    let dir = tempfile::tempdir().unwrap();
    let out = margay()
        .args(["confd", "--once", "--no-reload", "--config-dir"])
        .arg(dir.path())
        .env("NODENAME", not_utf8())
        .env("HOSTNAME", "")
        .env("DATASTORE_TYPE", "local")
        .env("DATASTORE_PATH", dir.path().join("absent.db"))
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_ne!(out.status.code(), Some(101), "{err}");
    assert!(
        err.contains("NODENAME") && err.contains("not UTF-8"),
        "{err}"
    );
}

#[test]
fn etcd_credentials_over_plain_http_are_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let out = margay()
        .args(["felix", "config", "-c"])
        .arg(dir.path().join("absent.cfg"))
        .env("DATASTORE_TYPE", "etcdv3")
        .env("ETCD_ENDPOINTS", "http://127.0.0.1:1")
        .env("ETCD_USERNAME", "felix")
        .env("ETCD_PASSWORD", "s3cret-pw")
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert!(
        err.contains("plain http") && err.contains("127.0.0.1:1"),
        "{err}"
    );
    assert!(!err.contains("s3cret-pw"), "{err}");
}

#[test]
fn felix_config_reports_huge_and_zero_durations_without_panicking() {
    let dir = tempfile::tempdir().unwrap();
    let out = margay()
        .args(["felix", "config", "--no-datastore", "-c"])
        .arg(dir.path().join("absent.cfg"))
        .env("FELIX_ROUTEREFRESHINTERVAL", "1e300")
        .env("FELIX_IPTABLESREFRESHINTERVAL", "NaN")
        .env("FELIX_TYPHAREADTIMEOUT", "0")
        .env(
            "FELIX_HEALTHTIMEOUTOVERRIDES",
            "InternalDataplaneMainLoop=99999999999h",
        )
        .output()
        .unwrap();
    let (stdout, err) = (text(&out.stdout), text(&out.stderr));
    assert_ne!(out.status.code(), Some(101), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // Each is named with what is wrong, and the default is used.
    assert!(
        stdout.contains("invalid value \"1e300\" for RouteRefreshInterval")
            && stdout.contains("invalid value \"NaN\" for IptablesRefreshInterval")
            && stdout.contains("\"99999999999h\" is not a valid duration (too large"),
        "{stdout}{err}"
    );
}
