//! One log event as a line, in each of margay's layouts. Pure: the event is captured into a
//! [`Record`] first, so the layouts are tested without a subscriber.

use std::fmt::Write as _;

use tracing::field::{Field, Visit};
use tracing::{Event, Level};

/// The line layouts (`--log-format`, MARGAY_LOG_FORMAT).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// `2026-11-25T06:40:00.123Z  INFO message key=value` (tracing's layout).
    #[default]
    Text,
    /// Calico's layout, for parsers written for Calico's logs:
    /// `2026-11-25 06:40:00.123 [INFO][1234] daemon.rs 120: message key="value"`.
    Calico,
    /// One JSON object per line (logrus's keys `time`, `level`, `msg`, plus `file`, `line`,
    /// `target` and the event's fields), for log shippers.
    Json,
}

impl std::str::FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "text" | "" => Ok(Format::Text),
            "calico" => Ok(Format::Calico),
            "json" => Ok(Format::Json),
            _ => Err(format!(
                "invalid --log-format (or MARGAY_LOG_FORMAT) {:?}: use text, calico or json",
                s.chars().take(64).collect::<String>()
            )),
        }
    }
}

/// A field's value, keeping numbers and booleans typed for JSON.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(String),
    Int(i64),
    Uint(u64),
    Float(f64),
    Bool(bool),
    /// Anything recorded through `Debug`/`Display` (`?x`, `%x`).
    Other(String),
}

/// What a layout needs from one event.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub level: Level,
    pub target: String,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub message: String,
    pub fields: Vec<(String, Value)>,
}

/// Longest field value or message kept in a line: a runaway value must not make a
/// multi-megabyte log line.
const MAX_VALUE: usize = 16 * 1024;

fn bounded(mut s: String) -> String {
    if s.len() > MAX_VALUE {
        let mut cut = MAX_VALUE;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("…(truncated)");
    }
    s
}

impl Record {
    /// Captures a tracing event.
    pub fn from_event(event: &Event<'_>) -> Record {
        let meta = event.metadata();
        let mut r = Record {
            level: *meta.level(),
            target: meta.target().to_string(),
            file: meta.file().map(|f| {
                // Calico prints the base name of the source file.
                f.rsplit('/').next().unwrap_or(f).to_string()
            }),
            line: meta.line(),
            message: String::new(),
            fields: Vec::new(),
        };
        event.record(&mut r);
        r
    }

    fn push(&mut self, field: &Field, value: Value) {
        if field.name() == "message" {
            self.message = bounded(match value {
                Value::Str(s) | Value::Other(s) => s,
                other => render_plain(&other),
            });
        } else {
            let value = match value {
                Value::Str(s) => Value::Str(bounded(s)),
                Value::Other(s) => Value::Other(bounded(s)),
                v => v,
            };
            self.fields.push((field.name().to_string(), value));
        }
    }
}

impl Visit for Record {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.push(field, Value::Other(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.push(field, Value::Str(value.to_string()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.push(field, Value::Int(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.push(field, Value::Uint(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.push(field, Value::Float(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.push(field, Value::Bool(value));
    }
}

fn render_plain(v: &Value) -> String {
    match v {
        Value::Str(s) | Value::Other(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        Value::Uint(u) => u.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Bool(b) => b.to_string(),
    }
}

/// A wall-clock instant as seconds and milliseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub secs: u64,
    pub millis: u32,
}

impl Stamp {
    pub fn now() -> Stamp {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Stamp {
            secs: d.as_secs(),
            millis: d.subsec_millis(),
        }
    }

    /// (year, month 1–12, day, hour, minute, second) in UTC: the process has no time zone
    /// database, so every layout is in UTC.
    pub fn civil(self) -> (i64, u32, u32, u64, u64, u64) {
        let days = self.secs / 86_400;
        let rem = self.secs % 86_400;
        // Civil date from days since the epoch (Howard Hinnant's algorithm).
        let z = days as i64 + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + i64::from(month <= 2);
        (
            year,
            u32::try_from(month).unwrap_or(1),
            u32::try_from(day).unwrap_or(1),
            rem / 3600,
            (rem % 3600) / 60,
            rem % 60,
        )
    }
}

/// Calico's level names (logrus, upper case).
fn calico_level_name(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "ERROR",
        Level::WARN => "WARNING",
        Level::INFO => "INFO",
        Level::DEBUG => "DEBUG",
        Level::TRACE => "TRACE",
    }
}

/// The record as one line (with its newline) in `format`.
pub fn render(format: Format, r: &Record, at: Stamp, pid: u32) -> String {
    let (y, mo, d, h, mi, s) = at.civil();
    let ms = at.millis;
    let mut out = String::with_capacity(96 + r.message.len() + r.fields.len() * 24);
    match format {
        Format::Text => {
            let _ = write!(
                out,
                "{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{ms:03}Z {:>5} {}",
                r.level, r.message
            );
            for (k, v) in &r.fields {
                let _ = write!(out, " {k}=");
                match v {
                    Value::Str(s) => {
                        let _ = write!(out, "{s:?}");
                    }
                    other => out.push_str(&render_plain(other)),
                }
            }
        }
        Format::Calico => {
            let _ = write!(
                out,
                "{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02}.{ms:03} [{}][{pid}] {} ",
                calico_level_name(&r.level),
                r.file.as_deref().unwrap_or("<nil>")
            );
            match r.line {
                Some(l) => {
                    let _ = write!(out, "{l}");
                }
                None => out.push_str("<nil>"),
            }
            out.push_str(": ");
            out.push_str(&r.message);
            // Calico sorts the fields and quotes string values.
            let mut fields: Vec<&(String, Value)> = r.fields.iter().collect();
            fields.sort_by(|a, b| a.0.cmp(&b.0));
            for (k, v) in fields {
                let _ = write!(out, " {k}=");
                match v {
                    Value::Str(s) | Value::Other(s) => {
                        let _ = write!(out, "{s:?}");
                    }
                    other => out.push_str(&render_plain(other)),
                }
            }
        }
        Format::Json => {
            let mut obj = serde_json::Map::new();
            obj.insert(
                "time".into(),
                format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{ms:03}Z").into(),
            );
            obj.insert(
                "level".into(),
                calico_level_name(&r.level).to_ascii_lowercase().into(),
            );
            obj.insert("msg".into(), r.message.clone().into());
            if let Some(f) = &r.file {
                obj.insert("file".into(), f.clone().into());
            }
            if let Some(l) = r.line {
                obj.insert("line".into(), l.into());
            }
            obj.insert("target".into(), r.target.clone().into());
            obj.insert("pid".into(), pid.into());
            for (k, v) in &r.fields {
                let v: serde_json::Value = match v {
                    Value::Str(s) | Value::Other(s) => s.clone().into(),
                    Value::Int(i) => (*i).into(),
                    Value::Uint(u) => (*u).into(),
                    Value::Float(f) => serde_json::Number::from_f64(*f)
                        .map(serde_json::Value::Number)
                        .unwrap_or_else(|| f.to_string().into()),
                    Value::Bool(b) => (*b).into(),
                };
                // A field never hides the record's own keys.
                let key = if obj.contains_key(k.as_str()) {
                    format!("fields.{k}")
                } else {
                    k.clone()
                };
                obj.insert(key, v);
            }
            out.push_str(&serde_json::Value::Object(obj).to_string());
        }
    }
    out.push('\n');
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record {
            level: Level::INFO,
            target: "margay_felix::daemon".into(),
            file: Some("mod.rs".into()),
            line: Some(120),
            message: "Skipping configuration of interface".into(),
            fields: vec![
                ("ifaceName".into(), Value::Str("cali1234".into())),
                ("count".into(), Value::Uint(3)),
                ("err".into(), Value::Other("Os { code: 2 }".into())),
            ],
        }
    }

    // 2017-01-05 09:17:48.238 UTC
    const AT: Stamp = Stamp {
        secs: 1_483_607_868,
        millis: 238,
    };

    #[test]
    fn calico_layout_matches_calicos_formatter() {
        assert_eq!(
            render(Format::Calico, &record(), AT, 85386),
            "2017-01-05 09:17:48.238 [INFO][85386] mod.rs 120: Skipping configuration of \
             interface count=3 err=\"Os { code: 2 }\" ifaceName=\"cali1234\"\n"
        );
        let mut r = record();
        r.level = Level::WARN;
        r.file = None;
        r.line = None;
        r.fields.clear();
        assert_eq!(
            render(Format::Calico, &r, AT, 1),
            "2017-01-05 09:17:48.238 [WARNING][1] <nil> <nil>: Skipping configuration of interface\n"
        );
    }

    #[test]
    fn json_layout_is_one_object_per_line_with_typed_fields() {
        let line = render(Format::Json, &record(), AT, 7);
        assert!(line.ends_with('\n') && !line.trim_end().contains('\n'));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["time"], "2017-01-05T09:17:48.238Z");
        assert_eq!(v["level"], "info");
        assert_eq!(v["msg"], "Skipping configuration of interface");
        assert_eq!(v["ifaceName"], "cali1234");
        assert_eq!(v["count"], 3);
        assert_eq!(v["line"], 120);
        assert_eq!(v["pid"], 7);
        // A field named like a record key does not replace it.
        let mut r = record();
        r.fields.push(("level".into(), Value::Str("mine".into())));
        let v: serde_json::Value = serde_json::from_str(&render(Format::Json, &r, AT, 7)).unwrap();
        assert_eq!(v["level"], "info");
        assert_eq!(v["fields.level"], "mine");
    }

    #[test]
    fn text_layout_and_format_names() {
        assert_eq!(
            render(Format::Text, &record(), AT, 1),
            "2017-01-05T09:17:48.238Z  INFO Skipping configuration of interface \
             ifaceName=\"cali1234\" count=3 err=Os { code: 2 }\n"
        );
        assert_eq!("JSON".parse::<Format>(), Ok(Format::Json));
        assert_eq!("calico".parse::<Format>(), Ok(Format::Calico));
        assert!(
            "xml"
                .parse::<Format>()
                .unwrap_err()
                .contains("text, calico or json")
        );
    }

    #[test]
    fn huge_values_are_cut() {
        let mut r = record();
        r.message = bounded("é".repeat(20_000));
        assert!(r.message.len() < MAX_VALUE + 20);
        assert!(r.message.ends_with("(truncated)"));
    }

    #[test]
    fn civil_dates() {
        assert_eq!(Stamp { secs: 0, millis: 0 }.civil(), (1970, 1, 1, 0, 0, 0));
        // 2024-02-29 12:00:00 UTC, a leap day.
        assert_eq!(
            Stamp {
                secs: 1_709_208_000,
                millis: 0
            }
            .civil(),
            (2024, 2, 29, 12, 0, 0)
        );
    }
}
