//! Log level names as Calico's components accept them (logrus: panic, fatal, error, warning,
//! info, debug, trace, in any case; `none` turns a destination off).

/// A Calico level name as a tracing level filter (`error`, `warn`, …, `off`); `None` for a
/// name Calico does not know.
pub fn calico_level(value: &str) -> Option<&'static str> {
    match value.trim().to_ascii_lowercase().as_str() {
        "panic" | "fatal" | "error" | "critical" => Some("error"),
        "warning" | "warn" => Some("warn"),
        "info" => Some("info"),
        "debug" => Some("debug"),
        "trace" => Some("trace"),
        "none" | "off" => Some("off"),
        _ => None,
    }
}

/// The `--log-level` / MARGAY_LOG_LEVEL value as a tracing filter: a Calico level name, or a
/// tracing filter with per-module directives (`info,margay_felix=debug`). Anything else is
/// refused: a misspelt level must not silently turn logging off.
pub fn log_filter(value: &str) -> Result<String, String> {
    let v = value.trim();
    if v.contains('=') {
        return tracing_subscriber::EnvFilter::try_new(v)
            .map(|_| v.to_string())
            .map_err(|e| format!("invalid --log-level filter {v:?}: {e}"));
    }
    calico_level(v).map(str::to_string).ok_or_else(|| {
        format!(
            "invalid --log-level (or MARGAY_LOG_LEVEL) {:?}: use one of panic, fatal, error, \
             warning, info, debug, trace or none, or a filter such as info,margay_felix=debug",
            v.chars().take(64).collect::<String>()
        )
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn calico_level_names_are_accepted_in_any_case() {
        for (given, filter) in [
            ("warning", "warn"),
            ("Warning", "warn"),
            ("WARN", "warn"),
            ("fatal", "error"),
            ("Panic", "error"),
            ("CRITICAL", "error"),
            ("error", "error"),
            ("Info", "info"),
            ("debug", "debug"),
            ("TRACE", "trace"),
            ("none", "off"),
            (" info ", "info"),
        ] {
            assert_eq!(log_filter(given).as_deref(), Ok(filter), "{given}");
        }
    }

    #[test]
    fn directives_pass_through_and_unknown_names_are_refused() {
        assert_eq!(
            log_filter("info,margay_felix=debug").as_deref(),
            Ok("info,margay_felix=debug")
        );
        for bad in ["warnings", "verbose", "", "inf0"] {
            let e = log_filter(bad).expect_err(bad);
            assert!(e.contains("warning, info"), "{e}");
        }
        // Echoes at most 64 characters of what it was given.
        let e = log_filter(&"x".repeat(10_000)).expect_err("long");
        assert!(e.len() < 400, "{}", e.len());
        assert_eq!(calico_level("loud"), None);
    }
}
