//! BGP passwords from files (edge).
//!
//! Calico reads `secretKeyRef {name, key}` from a Kubernetes Secret. margay has no
//! Kubernetes client, so a reference names a file: `<secrets dir>/<name>/<key>` — the layout
//! of a Secret mounted as a volume (one directory per secret, one file per key). The
//! directory is MARGAY_BGP_SECRETS_DIR (default [`DEFAULT_SECRETS_DIR`]). A trailing line
//! break is dropped (files written with `echo`). Passwords are never logged.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use crate::model::SecretRef;

pub const DEFAULT_SECRETS_DIR: &str = "/etc/calico/bgp-secrets";

/// The file a reference names, or None when a part could escape the directory.
pub fn secret_path(dir: &Path, r: &SecretRef) -> Option<PathBuf> {
    let safe = |s: &str| {
        !s.is_empty()
            && Path::new(s)
                .components()
                .all(|c| matches!(c, Component::Normal(_)))
            && !s.contains('/')
    };
    (safe(&r.name) && safe(&r.key)).then(|| dir.join(&r.name).join(&r.key))
}

/// Reads every reference it can; those it cannot are missing from the result (the renderer
/// leaves their sessions out) and described in the second value.
pub fn read_secrets(
    dir: &Path,
    refs: &BTreeSet<SecretRef>,
) -> (BTreeMap<SecretRef, String>, Vec<String>) {
    let mut found = BTreeMap::new();
    let mut problems = Vec::new();
    for r in refs {
        let Some(path) = secret_path(dir, r) else {
            problems.push(format!("secret reference {r} is not a plain name/key"));
            continue;
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let pw = text
                    .strip_suffix('\n')
                    .map(|t| t.strip_suffix('\r').unwrap_or(t))
                    .unwrap_or(&text);
                found.insert(r.clone(), pw.to_string());
            }
            Err(e) => problems.push(format!("cannot read {}: {e}", path.display())),
        }
    }
    (found, problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_mounted_secret_layout() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("bgp")).expect("mkdir");
        std::fs::write(dir.path().join("bgp/peer"), "s3cret\n").expect("write");
        let ok = SecretRef {
            name: "bgp".into(),
            key: "peer".into(),
        };
        let missing = SecretRef {
            name: "bgp".into(),
            key: "other".into(),
        };
        let escape = SecretRef {
            name: "..".into(),
            key: "passwd".into(),
        };
        let refs = [ok.clone(), missing, escape].into_iter().collect();
        let (found, problems) = read_secrets(dir.path(), &refs);
        assert_eq!(found.get(&ok).map(String::as_str), Some("s3cret"));
        assert_eq!(found.len(), 1);
        assert_eq!(problems.len(), 2);
    }
}
