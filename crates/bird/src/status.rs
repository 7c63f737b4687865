//! `show status` (pure).

use crate::reply::Reply;

/// BIRD's answer to `show status`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    /// `BIRD 2.0.12`.
    pub version: String,
    pub router_id: Option<String>,
    pub last_reboot: Option<String>,
    pub last_reconfiguration: Option<String>,
    /// A graceful-restart recovery is in progress (code 0024).
    pub graceful_restart: bool,
    /// The final line was 0013 "Daemon is up and running".
    pub up: bool,
}

impl Status {
    pub fn parse(reply: &Reply) -> Status {
        let mut s = Status {
            version: reply
                .with_code(1000)
                .next()
                .unwrap_or("")
                .trim()
                .to_string(),
            up: reply.code() == 13,
            ..Status::default()
        };
        for line in reply.with_code(1011) {
            let line = line.trim();
            if let Some(v) = line.strip_prefix("Router ID is ") {
                s.router_id = Some(v.to_string());
            } else if let Some(v) = line.strip_prefix("Last reboot on ") {
                s.last_reboot = Some(v.to_string());
            } else if let Some(v) = line.strip_prefix("Last reconfiguration on ") {
                s.last_reconfiguration = Some(v.to_string());
            }
        }
        s.graceful_restart = reply.with_code(24).next().is_some();
        s
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::reply::split_replies;

    #[test]
    fn running_daemon() {
        let r = split_replies(include_str!("../tests/replies/show_status.txt"))
            .unwrap()
            .pop()
            .unwrap();
        let s = Status::parse(&r);
        assert_eq!(s.version, "BIRD 2.0.12");
        assert_eq!(s.router_id.as_deref(), Some("172.31.9.1"));
        assert_eq!(s.last_reboot.as_deref(), Some("2026-11-22 05:31:30.521"));
        assert!(s.up);
        assert!(!s.graceful_restart);
    }

    #[test]
    fn graceful_restart_in_progress() {
        let r = split_replies(include_str!("../tests/replies/show_status_gr.txt"))
            .unwrap()
            .pop()
            .unwrap();
        let s = Status::parse(&r);
        assert!(s.graceful_restart);
        assert!(s.up);
    }
}
