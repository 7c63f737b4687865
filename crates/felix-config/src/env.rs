//! The process environment as text: variables whose name or value is not UTF-8 are left out
//! and named, instead of stopping the process (`std::env::vars` panics on them).

use std::collections::BTreeMap;
use std::ffi::OsString;

/// The UTF-8 variables of `vars` (e.g. `std::env::vars_os()`), and the names of those left
/// out (lossily decoded and escaped, so they print on one line).
pub fn utf8_env(
    vars: impl IntoIterator<Item = (OsString, OsString)>,
) -> (BTreeMap<String, String>, Vec<String>) {
    let mut env = BTreeMap::new();
    let mut skipped = Vec::new();
    for (k, v) in vars {
        match (k.into_string(), v.into_string()) {
            (Ok(k), Ok(v)) => {
                env.insert(k, v);
            }
            (Ok(k), Err(_)) => skipped.push(k.escape_debug().to_string()),
            (Err(k), _) => skipped.push(k.to_string_lossy().escape_debug().to_string()),
        }
    }
    (env, skipped)
}

/// The warning for variables [`utf8_env`] left out.
pub fn skipped_warning(skipped: &[String]) -> Option<String> {
    (!skipped.is_empty()).then(|| {
        format!(
            "ignoring environment variable(s) whose name or value is not UTF-8: {} \
             (set them to UTF-8 text or unset them)",
            skipped.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStringExt;

    #[test]
    fn non_utf8_entries_are_skipped_and_named() {
        let vars = vec![
            (
                OsString::from("FELIX_LOGSEVERITYSCREEN"),
                OsString::from("debug"),
            ),
            (
                OsString::from("FELIX_BAD"),
                OsString::from_vec(vec![0xff, b'x']),
            ),
            (
                OsString::from_vec(b"FELIX_\xe9\nX".to_vec()),
                OsString::from("1"),
            ),
        ];
        let (env, skipped) = utf8_env(vars);
        assert_eq!(env.len(), 1);
        assert_eq!(env["FELIX_LOGSEVERITYSCREEN"], "debug");
        assert_eq!(skipped, vec!["FELIX_BAD", "FELIX_\u{FFFD}\\nX"]);
        let w = skipped_warning(&skipped).unwrap_or_default();
        assert!(w.contains("FELIX_BAD") && !w.contains('\n'), "{w}");
    }
}
