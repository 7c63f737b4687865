//! `show protocols` and `show protocols all <name>` (pure).

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::BirdError;
use crate::reply::Reply;

/// The protocol table's columns (BIRD 2; BIRD 1 spelled them in lower case).
const HEADINGS: [&str; 6] = ["name", "proto", "table", "state", "since", "info"];

/// One row of `show protocols`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Protocol {
    pub name: String,
    /// `BGP`, `Kernel`, `Device`, `Static`, `Direct`, ...
    pub proto: String,
    pub table: String,
    /// BIRD's protocol state: `up`, `start`, `down`, `flush`, ...
    pub state: String,
    pub since: String,
    /// For BGP: the session state (`Established`, `Active`, `Connect`, `Idle`, `OpenSent`,
    /// `OpenConfirm`, `Close`) and sometimes why (`Active  Socket: No route to host`).
    pub info: String,
}

fn looks_like_date(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 10
        && b[4] == b'-'
        && b[7] == b'-'
        && b.iter()
            .enumerate()
            .all(|(i, c)| i == 4 || i == 7 || c.is_ascii_digit())
}

fn looks_like_time(s: &str) -> bool {
    s.len() >= 8 && s.as_bytes()[2] == b':' && s.as_bytes()[5] == b':'
}

impl Protocol {
    /// Parses one row. `None` for a row with fewer than five columns.
    pub fn parse_row(row: &str) -> Option<Protocol> {
        let mut rest = row.trim();
        let mut cols = Vec::with_capacity(5);
        while cols.len() < 5 {
            let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
            if end == 0 {
                break;
            }
            cols.push(&rest[..end]);
            rest = rest[end..].trim_start();
        }
        if cols.len() < 5 {
            return None;
        }
        let mut since = cols[4].to_string();
        // `timeformat protocol iso long` writes the date and the time as two words.
        if looks_like_date(&since) {
            let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
            if looks_like_time(&rest[..end]) {
                since = format!("{since} {}", &rest[..end]);
                rest = rest[end..].trim_start();
            }
        }
        Some(Protocol {
            name: cols[0].to_string(),
            proto: cols[1].to_string(),
            table: cols[2].to_string(),
            state: cols[3].to_string(),
            since,
            // Keep the info's words, not BIRD's column padding.
            info: rest.split_whitespace().collect::<Vec<_>>().join(" "),
        })
    }

    /// The table of a `show protocols` (or `show protocols all`) reply.
    pub fn parse_table(reply: &Reply) -> Result<Vec<Protocol>, BirdError> {
        if let Some(h) = reply.with_code(2002).next() {
            let found: Vec<String> = h.split_whitespace().map(str::to_string).collect();
            let ok = found.len() == HEADINGS.len()
                && found
                    .iter()
                    .zip(HEADINGS)
                    .all(|(f, want)| f.eq_ignore_ascii_case(want));
            if !ok {
                return Err(BirdError::Headings { found });
            }
        }
        Ok(reply
            .with_code(1002)
            .filter_map(Protocol::parse_row)
            .collect())
    }

    /// The BGP session state: the first word of the info column ("" when the protocol is
    /// down and BIRD shows none).
    pub fn bgp_state(&self) -> &str {
        self.info.split_whitespace().next().unwrap_or("")
    }

    /// What follows the BGP state in the info column (`Socket: No route to host`).
    pub fn bgp_info(&self) -> &str {
        let state = self.bgp_state();
        self.info[state.len()..].trim()
    }
}

/// How Calico names its peers (`Mesh_<ip>`, `Global_<ip>`, `Node_<ip>`), and how
/// `calicoctl node status` shows each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PeerType {
    Mesh,
    Global,
    Node,
}

impl PeerType {
    fn from_prefix(p: &str) -> Option<PeerType> {
        match p {
            "Mesh" => Some(PeerType::Mesh),
            "Global" => Some(PeerType::Global),
            "Node" => Some(PeerType::Node),
            _ => None,
        }
    }
}

impl fmt::Display for PeerType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PeerType::Mesh => "node-to-node mesh",
            PeerType::Global => "global",
            PeerType::Node => "node specific",
        })
    }
}

/// A BGP session BIRD runs for one of Calico's peers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BgpPeer {
    /// The BIRD protocol name (`Mesh_172_31_0_12`).
    pub name: String,
    pub peer_type: PeerType,
    pub peer_ip: IpAddr,
    /// The peer's port when the name says one (`..._port_179`).
    pub port: Option<u16>,
    /// BIRD's protocol state (`up`, `start`, `down`).
    pub state: String,
    pub since: String,
    /// `Established`, `Active`, `Connect`, `Idle`, ... ("" when BIRD shows none).
    pub bgp_state: String,
    /// The rest of the info column (a reason, when BIRD gives one).
    pub info: String,
}

impl BgpPeer {
    pub fn is_established(&self) -> bool {
        self.bgp_state == "Established"
    }

    /// `calicoctl node status`'s Info column: the BGP state, then the reason if any.
    pub fn info_column(&self) -> String {
        match (self.bgp_state.is_empty(), self.info.is_empty()) {
            (true, true) => String::new(),
            (true, false) => self.info.clone(),
            (false, true) => self.bgp_state.clone(),
            (false, false) => format!("{} {}", self.bgp_state, self.info),
        }
    }
}

/// The JSON form `margay ctl node status -o json` and `margay lab status --json` show: camelCase
/// names, the address and peer type as text (the type as `calicoctl node status` words it),
/// and whether the session is established. The port is not shown (calicoctl does not).
impl serde::Serialize for BgpPeer {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut s = serializer.serialize_struct("BgpPeer", 8)?;
        s.serialize_field("name", &self.name)?;
        s.serialize_field("peerAddress", &self.peer_ip.to_string())?;
        s.serialize_field("peerType", &self.peer_type.to_string())?;
        s.serialize_field("state", &self.state)?;
        s.serialize_field("since", &self.since)?;
        s.serialize_field("bgpState", &self.bgp_state)?;
        s.serialize_field("info", &self.info)?;
        s.serialize_field("established", &self.is_established())?;
        s.end()
    }
}

/// The address a protocol name encodes: `172_31_0_12` (dots) or `fd80_24e2__2` (colons).
fn name_to_ip(encoded: &str) -> Option<IpAddr> {
    if let Ok(v4) = encoded.replace('_', ".").parse::<Ipv4Addr>() {
        return Some(IpAddr::V4(v4));
    }
    encoded
        .replace('_', ":")
        .parse::<Ipv6Addr>()
        .ok()
        .map(IpAddr::V6)
}

/// Reads a Calico peer name: `<Mesh|Global|Node>_<address>[_port_<n>]`.
pub fn parse_peer_name(name: &str) -> Option<(PeerType, IpAddr, Option<u16>)> {
    let (kind, rest) = name.split_once('_')?;
    let kind = PeerType::from_prefix(kind)?;
    let (addr, port) = match rest.rsplit_once("_port_") {
        Some((a, p)) => (a, Some(p.parse::<u16>().ok()?)),
        None => (rest, None),
    };
    Some((kind, name_to_ip(addr)?, port))
}

/// The BGP protocols among `protocols` that are Calico peers (others, such as a hand-made
/// `bgp1`, are not margay's and are left out, as calicoctl does).
pub fn bgp_peers(protocols: &[Protocol]) -> Vec<BgpPeer> {
    protocols
        .iter()
        .filter(|p| p.proto == "BGP")
        .filter_map(|p| {
            let (peer_type, peer_ip, port) = parse_peer_name(&p.name)?;
            Some(BgpPeer {
                name: p.name.clone(),
                peer_type,
                peer_ip,
                port,
                state: p.state.clone(),
                since: p.since.clone(),
                bgp_state: p.bgp_state().to_string(),
                info: p.bgp_info().to_string(),
            })
        })
        .collect()
}

/// `show protocols all <name>`: the row and the `Key: value` details (first level only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolDetail {
    pub protocol: Protocol,
    pub fields: BTreeMap<String, String>,
}

impl ProtocolDetail {
    /// `None` when the reply has no protocol row.
    pub fn parse(reply: &Reply) -> Result<Option<ProtocolDetail>, BirdError> {
        let Some(protocol) = Protocol::parse_table(reply)?.into_iter().next() else {
            return Ok(None);
        };
        let mut fields = BTreeMap::new();
        for line in reply.with_code(1006) {
            // Channel sections come last and repeat keys ("State: UP"); nested details
            // (capabilities, statistics) are indented further.
            if line.trim_start().starts_with("Channel ") {
                break;
            }
            let indent = line.len() - line.trim_start().len();
            if indent > 4 {
                continue;
            }
            if let Some((k, v)) = line.trim().split_once(':') {
                let v = v.trim();
                if !v.is_empty() {
                    fields
                        .entry(k.trim().to_string())
                        .or_insert_with(|| v.to_string());
                }
            }
        }
        Ok(Some(ProtocolDetail { protocol, fields }))
    }

    pub fn field(&self, key: &str) -> Option<&str> {
        self.fields.get(key).map(String::as_str)
    }

    pub fn bgp_state(&self) -> Option<&str> {
        self.field("BGP state")
    }

    pub fn neighbor_address(&self) -> Option<&str> {
        self.field("Neighbor address")
    }

    pub fn source_address(&self) -> Option<&str> {
        self.field("Source address")
    }

    pub fn last_error(&self) -> Option<&str> {
        self.field("Last error")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::reply::split_replies;

    fn answer(text: &str) -> Reply {
        split_replies(text).unwrap().pop().unwrap()
    }

    #[test]
    fn protocol_table_rows() {
        let r = answer(include_str!("../tests/replies/show_protocols.txt"));
        let t = Protocol::parse_table(&r).unwrap();
        assert_eq!(t.len(), 9);
        assert_eq!(
            t[0],
            Protocol {
                name: "device1".into(),
                proto: "Device".into(),
                table: "---".into(),
                state: "up".into(),
                since: "05:31:30.521".into(),
                info: String::new(),
            }
        );
        assert_eq!(t[3].name, "Mesh_172_31_9_2");
        assert_eq!(t[3].bgp_state(), "Established");
        assert_eq!(t[4].bgp_state(), "Active");
        assert_eq!(t[4].bgp_info(), "Socket: No route to host");
    }

    #[test]
    fn peers_by_calico_name_with_their_states() {
        let r = answer(include_str!("../tests/replies/show_protocols.txt"));
        let peers = bgp_peers(&Protocol::parse_table(&r).unwrap());
        let summary: Vec<(String, PeerType, String, String, bool)> = peers
            .iter()
            .map(|p| {
                (
                    p.peer_ip.to_string(),
                    p.peer_type,
                    p.state.clone(),
                    p.info_column(),
                    p.is_established(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                (
                    "172.31.9.2".into(),
                    PeerType::Mesh,
                    "up".into(),
                    "Established".into(),
                    true
                ),
                (
                    "172.31.9.77".into(),
                    PeerType::Node,
                    "start".into(),
                    "Active Socket: No route to host".into(),
                    false
                ),
                (
                    "10.192.0.3".into(),
                    PeerType::Global,
                    "start".into(),
                    "Connect".into(),
                    false
                ),
                (
                    "fd80:24e2:f998:72d7::2".into(),
                    PeerType::Mesh,
                    "start".into(),
                    "Idle".into(),
                    false
                ),
                // Disabled: BIRD shows no BGP state at all.
                (
                    "172.31.9.78".into(),
                    PeerType::Node,
                    "down".into(),
                    String::new(),
                    false
                ),
            ]
        );
        assert_eq!(peers[2].port, Some(150));
        assert_eq!(peers[2].since, "2026-11-21");
    }

    #[test]
    fn peer_names() {
        assert_eq!(
            parse_peer_name("Mesh_10_0_0_1"),
            Some((PeerType::Mesh, "10.0.0.1".parse().unwrap(), None))
        );
        assert_eq!(
            parse_peer_name("Global_2001_db8__100_port_1790"),
            Some((
                PeerType::Global,
                "2001:db8::100".parse().unwrap(),
                Some(1790)
            ))
        );
        for bad in [
            "bgp1",
            "Mesh_",
            "Peer_10_0_0_1",
            "Node_10_0_0",
            "Node_x_port_1",
        ] {
            assert_eq!(parse_peer_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn display_types_are_calicoctls() {
        assert_eq!(PeerType::Mesh.to_string(), "node-to-node mesh");
        assert_eq!(PeerType::Global.to_string(), "global");
        assert_eq!(PeerType::Node.to_string(), "node specific");
    }

    #[test]
    fn iso_long_since_is_two_words() {
        let p = Protocol::parse_row(
            "Mesh_10_0_0_2 BGP        ---        up     2026-11-21 05:31:32  Established",
        )
        .unwrap();
        assert_eq!(p.since, "2026-11-21 05:31:32");
        assert_eq!(p.info, "Established");
        assert!(Protocol::parse_row("too few columns").is_none());
    }

    #[test]
    fn unknown_headings_are_refused() {
        let r = answer("2002-Name Proto Table State\n1002-x BGP --- up\n0000 \n");
        assert!(matches!(
            Protocol::parse_table(&r),
            Err(BirdError::Headings { .. })
        ));
        // BIRD 1's lower-case headings are fine.
        let r = answer(
            "2002-name proto table state since info\n1002-Mesh_1_2_3_4 BGP master up 2016-11-21 Established\n0000 \n",
        );
        assert_eq!(bgp_peers(&Protocol::parse_table(&r).unwrap()).len(), 1);
    }

    #[test]
    fn details_of_an_established_and_an_active_session() {
        let d = ProtocolDetail::parse(&answer(include_str!(
            "../tests/replies/show_protocols_all_established.txt"
        )))
        .unwrap()
        .unwrap();
        assert_eq!(d.bgp_state(), Some("Established"));
        assert_eq!(d.neighbor_address(), Some("172.31.9.2"));
        assert_eq!(d.source_address(), Some("172.31.9.1"));
        assert_eq!(d.last_error(), None);
        // Channel details are nested: "State: UP" is not the protocol's.
        assert_eq!(d.field("State"), None);

        let d = ProtocolDetail::parse(&answer(include_str!(
            "../tests/replies/show_protocols_all_active.txt"
        )))
        .unwrap()
        .unwrap();
        assert_eq!(d.bgp_state(), Some("Active"));
        assert_eq!(d.last_error(), Some("Socket: No route to host"));
        assert_eq!(d.protocol.name, "Node_172_31_9_77");
    }

    #[test]
    fn peer_json_form() {
        let peer = BgpPeer {
            name: "Mesh_172_31_0_12".into(),
            peer_type: PeerType::Mesh,
            peer_ip: "172.31.0.12".parse().unwrap(),
            port: None,
            state: "up".into(),
            since: "10:42:07".into(),
            bgp_state: "Established".into(),
            info: String::new(),
        };
        assert_eq!(
            serde_json::to_value(&peer).unwrap(),
            serde_json::json!({
                "name": "Mesh_172_31_0_12",
                "peerAddress": "172.31.0.12",
                "peerType": "node-to-node mesh",
                "state": "up",
                "since": "10:42:07",
                "bgpState": "Established",
                "info": "",
                "established": true,
            })
        );
    }
}
