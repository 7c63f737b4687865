//! Felix's syslog destination (LogSeveritySys), as Calico's Felix writes it: the local syslog
//! socket (`/dev/log`, `/var/run/syslog` or `/var/run/log`; MARGAY_SYSLOG_SOCKET names another,
//! for tests), facility user, one datagram per event in the local format
//! `<PRI>Mmm dd hh:mm:ss calico-felix[PID]: message`. Off until Felix sets a level.

use std::fmt::Write as _;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::Mutex;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// Overrides the syslog socket (tests).
pub const ENV_SOCKET: &str = "MARGAY_SYSLOG_SOCKET";
/// Where a local syslog daemon listens, in the order Go's `log/syslog` tries them.
const SOCKETS: [&str; 3] = ["/dev/log", "/var/run/syslog", "/var/run/log"];
/// The tag Calico's Felix logs with.
const TAG: &str = "calico-felix";
/// syslog facility `user`.
const FACILITY_USER: u8 = 1;

/// The syslog severity of a tracing level (RFC 5424: error 3, warning 4, info 6, debug 7).
fn severity(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        Level::DEBUG | Level::TRACE => 7,
    }
}

/// One message in the local syslog format (no host name: the daemon adds it).
pub fn format_message(level: &Level, stamp: &str, pid: u32, text: &str) -> String {
    format!(
        "<{}>{stamp} {TAG}[{pid}]: {text}",
        FACILITY_USER * 8 + severity(level)
    )
}

/// The time as syslog's `Mmm dd hh:mm:ss` (UTC: the process has no time zone database).
fn stamp() -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let (_, month, day, h, m, s) = crate::format::Stamp::now().civil();
    format!(
        "{} {day:>2} {h:02}:{m:02}:{s:02}",
        MONTHS[usize::try_from(month.saturating_sub(1)).unwrap_or(0) % 12],
    )
}

/// Sends events to the local syslog socket. Connected when Felix turns it on.
#[derive(Debug, Default)]
pub struct SyslogLayer {
    sock: Mutex<Option<UnixDatagram>>,
}

impl SyslogLayer {
    /// Connects to the local syslog socket (replacing an earlier connection).
    pub fn connect(&self) -> Result<(), String> {
        let candidates: Vec<PathBuf> = match std::env::var_os(ENV_SOCKET) {
            Some(p) => vec![PathBuf::from(p)],
            None => SOCKETS.iter().map(PathBuf::from).collect(),
        };
        let mut errors = Vec::new();
        for path in candidates {
            let sock = UnixDatagram::unbound().map_err(|e| e.to_string())?;
            match sock
                .connect(&path)
                .and_then(|()| sock.set_nonblocking(true))
            {
                Ok(()) => {
                    *self.sock.lock().unwrap_or_else(|e| e.into_inner()) = Some(sock);
                    return Ok(());
                }
                Err(e) => errors.push(format!("{}: {e}", path.display())),
            }
        }
        Err(format!("no syslog socket ({})", errors.join("; ")))
    }

    /// Stops sending.
    pub fn disconnect(&self) {
        *self.sock.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// A [`SyslogLayer`] shared with whoever turns it on and off.
#[derive(Debug, Clone)]
pub struct Shared(pub std::sync::Arc<SyslogLayer>);

impl<S: Subscriber> Layer<S> for Shared {
    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        self.0.on_event(event, ctx);
    }
}

/// The event's message and fields as one line (`message key=value …`).
#[derive(Default)]
struct Line(String);

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let fields = std::mem::take(&mut self.0);
            let _ = write!(self.0, "{value:?}");
            self.0.push_str(&fields);
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            let fields = std::mem::take(&mut self.0);
            self.0.push_str(value);
            self.0.push_str(&fields);
        } else {
            let _ = write!(self.0, " {}={value}", field.name());
        }
    }
}

impl<S: Subscriber> Layer<S> for SyslogLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let guard = self.sock.lock().unwrap_or_else(|e| e.into_inner());
        let Some(sock) = guard.as_ref() else {
            return;
        };
        let mut line = Line::default();
        event.record(&mut line);
        let msg = format_message(
            event.metadata().level(),
            &stamp(),
            std::process::id(),
            &line.0,
        );
        // A full or gone syslog daemon must never hold Felix up: the datagram is dropped.
        let _ = sock.send(msg.as_bytes());
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn messages_carry_facility_user_and_the_severity() {
        assert_eq!(
            format_message(&Level::INFO, "Nov 25 10:00:00", 42, "hello"),
            "<14>Nov 25 10:00:00 calico-felix[42]: hello"
        );
        assert!(format_message(&Level::WARN, "x", 1, "w").starts_with("<12>"));
        assert!(format_message(&Level::ERROR, "x", 1, "e").starts_with("<11>"));
        assert!(format_message(&Level::DEBUG, "x", 1, "d").starts_with("<15>"));
        let s = stamp();
        assert_eq!(s.len(), 15, "{s}");
    }
}
