//! Set and map elements written over nfnetlink directly.
//!
//! Why: `nft -f` loads every element of every set in the table before it applies any element
//! change (about 150 ms with 10k elements, whatever the size of the change), while chain and
//! rule changes cost it a few milliseconds. Writing elements as nfnetlink batches makes an
//! element change cost what it changes. One batch is one kernel transaction (atomic).
//!
//! Encoding (uapi `linux/netfilter/nf_tables.h`): a batch is BATCH_BEGIN, NEWSETELEM /
//! DELSETELEM messages (table, set, nested element list), BATCH_END. Keys are the set's key
//! type in network byte order, concatenation fields padded to 4 bytes; an interval set holds
//! each range as a start element and an end element (first address after the range) flagged
//! INTERVAL_END, exactly as nft itself stores it.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use margay_api::net::Cidr;

/// What the elements of a set look like, from its declaration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElemType {
    /// `ipv4_addr` / `ipv6_addr`, with `flags interval`.
    AddrInterval,
    /// `ipv4_addr` / `ipv6_addr` without intervals.
    Addr,
    /// `ipv4_addr . inet_proto . inet_service`.
    AddrProtoPort,
    /// `ifname`.
    Ifname,
    /// `ifname : verdict` (a verdict map).
    IfnameVerdict,
    /// `ipv4_addr . inet_proto . inet_service : verdict` (services by address).
    AddrProtoPortVerdict,
    /// `inet_proto . inet_service : verdict` (NodePorts).
    ProtoPortVerdict,
    /// `address . port . numgen slot : address . port` (a service frontend's backends, one
    /// per slot; one map per protocol).
    SlotBackend,
    /// `port . numgen slot : address . port` (a NodePort's backends).
    NodePortSlotBackend,
    /// `address . inet_service` (service frontends by backend count).
    AddrPort,
    /// `inet_service` (NodePorts by backend count).
    Port,
    /// `address . address . address . inet_proto . inet_service` (service hairpin: client,
    /// backend, ClusterIP, protocol, service port).
    Hairpin,
}

impl ElemType {
    pub fn of_decl(decl: &str) -> Option<ElemType> {
        if decl.contains(". numgen random mod 1 :") {
            return Some(if decl.starts_with("typeof ip") {
                ElemType::SlotBackend
            } else {
                ElemType::NodePortSlotBackend
            });
        }
        if decl.contains("ipv4_addr . ipv4_addr . ipv4_addr . inet_proto . inet_service")
            || decl.contains("ipv6_addr . ipv6_addr . ipv6_addr . inet_proto . inet_service")
        {
            return Some(ElemType::Hairpin);
        }
        if decl == "type ipv4_addr . inet_service;" || decl == "type ipv6_addr . inet_service;" {
            return Some(ElemType::AddrPort);
        }
        if decl == "type inet_service;" {
            return Some(ElemType::Port);
        }
        let interval = decl.contains("flags interval");
        let addr = decl.contains("ipv4_addr") || decl.contains("ipv6_addr");
        if decl.contains(": verdict") && decl.contains("ifname") {
            Some(ElemType::IfnameVerdict)
        } else if decl.contains(": verdict") && decl.contains("inet_proto . inet_service") {
            Some(if addr {
                ElemType::AddrProtoPortVerdict
            } else {
                ElemType::ProtoPortVerdict
            })
        } else if decl.contains(": verdict") {
            None
        } else if decl.contains("inet_proto") && decl.contains("inet_service") {
            Some(ElemType::AddrProtoPort)
        } else if decl.contains("type ifname") {
            Some(ElemType::Ifname)
        } else if decl.contains("ipv4_addr") || decl.contains("ipv6_addr") {
            Some(if interval {
                ElemType::AddrInterval
            } else {
                ElemType::Addr
            })
        } else {
            None
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ElementError {
    #[error("element {elem:?} of set {set}: {reason}")]
    Encode {
        set: String,
        elem: String,
        reason: String,
    },
    #[error("nfnetlink: {0}")]
    Io(String),
    #[error("the kernel refused element changes in set {set}: {reason}")]
    Rejected { set: String, reason: String },
}

/// One set's element changes.
#[derive(Debug, Clone)]
pub struct ElementChange {
    pub set: String,
    pub kind: ElemType,
    /// Element text as rendered (`10.0.0.0/8`, `"cali1"`, `10.0.0.1 . tcp . 80`), with the
    /// verdict for maps (`jump tw-cali1`).
    pub add: Vec<(String, Option<String>)>,
    pub delete: Vec<(String, Option<String>)>,
}

// --- uapi constants ---------------------------------------------------------------------------
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_CREATE: u16 = 0x400;
const NLMSG_ERROR: u16 = 0x2;
const NLA_F_NESTED: u16 = 0x8000;
const NFPROTO_INET: u8 = 1;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_SET_ELEM_FLAGS: u16 = 3;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
const NFT_SET_ELEM_INTERVAL_END: u32 = 1;
const NFT_JUMP: i32 = -3;
const NFT_GOTO: i32 = -4;
const IFNAMSIZ: usize = 16;
/// Elements per message (keeps each message well under the socket's limits).
const ELEMS_PER_MSG: usize = 256;

fn attr(buf: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(payload);
    while !buf.len().is_multiple_of(4) {
        buf.push(0);
    }
}

fn nested(buf: &mut Vec<u8>, kind: u16, inner: impl FnOnce(&mut Vec<u8>)) {
    let start = buf.len();
    buf.extend_from_slice(&[0, 0]);
    buf.extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
    inner(buf);
    let len = (buf.len() - start) as u16;
    buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
}

fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

fn message(kind: u16, flags: u16, seq: u32, family: u8, res_id: u16, attrs: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(20 + attrs.len());
    let len = (16 + 4 + attrs.len()) as u32;
    m.extend_from_slice(&len.to_ne_bytes());
    m.extend_from_slice(&kind.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    // nfgenmsg: family, version, res_id (big endian).
    m.push(family);
    m.push(0);
    m.extend_from_slice(&res_id.to_be_bytes());
    m.extend_from_slice(attrs);
    m
}

fn addr_bytes(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// The first address after a CIDR, None when the CIDR reaches the top of the space.
fn after(c: &Cidr) -> Option<IpAddr> {
    let net = c.network();
    match net.addr() {
        IpAddr::V4(a) => {
            let size = 1u64 << (32 - u32::from(net.prefix()));
            let end = u64::from(u32::from(a)) + size;
            u32::try_from(end).ok().map(|v| IpAddr::V4(v.into()))
        }
        IpAddr::V6(a) => {
            let host_bits = 128 - u32::from(net.prefix());
            let size = 1u128.checked_shl(host_bits)?;
            u128::from(a)
                .checked_add(size)
                .map(|v| IpAddr::V6(v.into()))
        }
    }
}

/// Keys (and flags) for one element.
fn keys(kind: ElemType, text: &str) -> Result<Vec<(Vec<u8>, u32)>, String> {
    match kind {
        ElemType::Addr => {
            let ip: IpAddr = text.parse().map_err(|_| "not an address".to_string())?;
            Ok(vec![(addr_bytes(ip), 0)])
        }
        ElemType::AddrInterval => {
            let c = Cidr::parse_cidr_or_ip(text)?;
            let mut out = vec![(addr_bytes(c.network().addr()), 0)];
            if let Some(end) = after(&c) {
                out.push((addr_bytes(end), NFT_SET_ELEM_INTERVAL_END));
            }
            Ok(out)
        }
        ElemType::AddrProtoPort | ElemType::AddrProtoPortVerdict => {
            let parts: Vec<&str> = text.split(" . ").collect();
            let [ip, proto, port] = parts.as_slice() else {
                return Err("expected `address . protocol . port`".into());
            };
            let ip: IpAddr = ip.parse().map_err(|_| "not an address".to_string())?;
            let mut key = addr_bytes(ip);
            key.extend(proto_port_key(proto, port)?);
            Ok(vec![(key, 0)])
        }
        ElemType::ProtoPortVerdict => {
            let parts: Vec<&str> = text.split(" . ").collect();
            let [proto, port] = parts.as_slice() else {
                return Err("expected `protocol . port`".into());
            };
            Ok(vec![(proto_port_key(proto, port)?, 0)])
        }
        ElemType::SlotBackend => {
            let parts: Vec<&str> = text.split(" . ").collect();
            let [ip, port, slot] = parts.as_slice() else {
                return Err("expected `address . port . slot`".into());
            };
            let ip: IpAddr = ip.parse().map_err(|_| "not an address".to_string())?;
            let mut key = addr_bytes(ip);
            key.extend(port_field(port)?);
            key.extend(slot_key(slot)?);
            Ok(vec![(key, 0)])
        }
        ElemType::NodePortSlotBackend => {
            let parts: Vec<&str> = text.split(" . ").collect();
            let [port, slot] = parts.as_slice() else {
                return Err("expected `port . slot`".into());
            };
            let mut key = port_field(port)?.to_vec();
            key.extend(slot_key(slot)?);
            Ok(vec![(key, 0)])
        }
        ElemType::AddrPort => {
            let (ip, port) = text
                .split_once(" . ")
                .ok_or_else(|| "expected `address . port`".to_string())?;
            let ip: IpAddr = ip.parse().map_err(|_| "not an address".to_string())?;
            let mut key = addr_bytes(ip);
            key.extend(port_field(port)?);
            Ok(vec![(key, 0)])
        }
        ElemType::Port => {
            let port: u16 = text.parse().map_err(|_| "bad port".to_string())?;
            // A lone port is not a concatenation: two bytes, no padding.
            Ok(vec![(port.to_be_bytes().to_vec(), 0)])
        }
        ElemType::Hairpin => {
            let parts: Vec<&str> = text.split(" . ").collect();
            let [a, b, c, proto, port] = parts.as_slice() else {
                return Err("expected `address . address . address . protocol . port`".into());
            };
            let mut key = Vec::with_capacity(56);
            for ip in [a, b, c] {
                let ip: IpAddr = ip.parse().map_err(|_| "not an address".to_string())?;
                key.extend(addr_bytes(ip));
            }
            key.extend(proto_port_key(proto, port)?);
            Ok(vec![(key, 0)])
        }
        ElemType::Ifname | ElemType::IfnameVerdict => {
            let name = text.trim_matches('"');
            if name.len() >= IFNAMSIZ {
                return Err("interface name too long".into());
            }
            let mut key = name.as_bytes().to_vec();
            key.resize(IFNAMSIZ, 0);
            Ok(vec![(key, 0)])
        }
    }
}

/// A port as a concatenation field: network order, padded to 4 bytes.
fn port_field(port: &str) -> Result<[u8; 4], String> {
    let port: u16 = port.parse().map_err(|_| "bad port".to_string())?;
    let [hi, lo] = port.to_be_bytes();
    Ok([hi, lo, 0, 0])
}

/// A `numgen` result as a concatenation field: numgen writes a host-order u32.
fn slot_key(slot: &str) -> Result<[u8; 4], String> {
    let slot: u32 = slot.parse().map_err(|_| "bad slot".to_string())?;
    Ok(slot.to_ne_bytes())
}

/// Map data `address . port` (a backend).
fn backend_data(text: &str) -> Result<Vec<u8>, String> {
    let (ip, port) = text
        .split_once(" . ")
        .ok_or_else(|| "expected `address . port`".to_string())?;
    let ip: IpAddr = ip.parse().map_err(|_| "not an address".to_string())?;
    let mut data = addr_bytes(ip);
    data.extend(port_field(port)?);
    Ok(data)
}

/// `inet_proto . inet_service` as concatenation fields (each padded to 4 bytes).
fn proto_port_key(proto: &str, port: &str) -> Result<Vec<u8>, String> {
    let proto: u8 = match proto {
        "tcp" => 6,
        "udp" => 17,
        "sctp" => 132,
        other => other
            .parse()
            .map_err(|_| format!("unknown protocol {other}"))?,
    };
    let port: u16 = port.parse().map_err(|_| "bad port".to_string())?;
    let mut key = vec![proto, 0, 0, 0];
    key.extend_from_slice(&port.to_be_bytes());
    key.extend_from_slice(&[0, 0]);
    Ok(key)
}

fn verdict(v: &str) -> Result<(i32, String), String> {
    let (kw, chain) = v
        .split_once(' ')
        .ok_or_else(|| format!("unsupported verdict {v:?}"))?;
    let code = match kw {
        "jump" => NFT_JUMP,
        "goto" => NFT_GOTO,
        _ => return Err(format!("unsupported verdict {v:?}")),
    };
    Ok((code, chain.to_string()))
}

/// An element's data: a verdict (verdict maps) or a value (data maps).
enum Data {
    Verdict((i32, String)),
    Value(Vec<u8>),
}

/// Encodes the element messages for all changes: deletions first, then additions. Each
/// message carries at most [`ELEMS_PER_MSG`] elements of one set.
pub fn encode_messages(
    table: &str,
    changes: &[ElementChange],
) -> Result<Vec<Vec<u8>>, ElementError> {
    let mut out = Vec::new();
    for delete in [true, false] {
        for change in changes {
            let list = if delete { &change.delete } else { &change.add };
            for chunk in list.chunks(ELEMS_PER_MSG) {
                let mut attrs = Vec::new();
                attr(&mut attrs, NFTA_SET_ELEM_LIST_TABLE, &cstr(table));
                attr(&mut attrs, NFTA_SET_ELEM_LIST_SET, &cstr(&change.set));
                let mut err = None;
                nested(&mut attrs, NFTA_SET_ELEM_LIST_ELEMENTS, |b| {
                    for (text, data) in chunk {
                        let encode_err = |reason: String| ElementError::Encode {
                            set: change.set.clone(),
                            elem: text.clone(),
                            reason,
                        };
                        let ks = match keys(change.kind, text) {
                            Ok(k) => k,
                            Err(reason) => {
                                err = Some(encode_err(reason));
                                return;
                            }
                        };
                        let v = match (change.kind, data) {
                            (
                                ElemType::IfnameVerdict
                                | ElemType::AddrProtoPortVerdict
                                | ElemType::ProtoPortVerdict,
                                Some(d),
                            ) => match verdict(d) {
                                Ok(v) => Some(Data::Verdict(v)),
                                Err(reason) => {
                                    err = Some(encode_err(reason));
                                    return;
                                }
                            },
                            (ElemType::SlotBackend | ElemType::NodePortSlotBackend, Some(d)) => {
                                match backend_data(d) {
                                    Ok(v) => Some(Data::Value(v)),
                                    Err(reason) => {
                                        err = Some(encode_err(reason));
                                        return;
                                    }
                                }
                            }
                            _ => None,
                        };
                        for (key, flags) in ks {
                            nested(b, NFTA_LIST_ELEM, |e| {
                                nested(e, NFTA_SET_ELEM_KEY, |k| attr(k, NFTA_DATA_VALUE, &key));
                                if flags != 0 {
                                    attr(e, NFTA_SET_ELEM_FLAGS, &flags.to_be_bytes());
                                }
                                // Deletions identify elements by key; the data is not needed.
                                match (&v, delete) {
                                    (Some(Data::Verdict((code, chain))), false) => {
                                        nested(e, NFTA_SET_ELEM_DATA, |d| {
                                            nested(d, NFTA_DATA_VERDICT, |vd| {
                                                attr(vd, NFTA_VERDICT_CODE, &code.to_be_bytes());
                                                attr(vd, NFTA_VERDICT_CHAIN, &cstr(chain));
                                            });
                                        });
                                    }
                                    (Some(Data::Value(bytes)), false) => {
                                        nested(e, NFTA_SET_ELEM_DATA, |d| {
                                            attr(d, NFTA_DATA_VALUE, bytes)
                                        });
                                    }
                                    _ => {}
                                }
                            });
                        }
                    }
                });
                if let Some(e) = err {
                    return Err(e);
                }
                let (kind, flags) = if delete {
                    (NFT_MSG_DELSETELEM, NLM_F_REQUEST | NLM_F_ACK)
                } else {
                    (NFT_MSG_NEWSETELEM, NLM_F_REQUEST | NLM_F_CREATE | NLM_F_ACK)
                };
                out.push(message(
                    (NFNL_SUBSYS_NFTABLES << 8) | kind,
                    flags,
                    0,
                    NFPROTO_INET,
                    0,
                    &attrs,
                ));
            }
        }
    }
    Ok(out)
}

/// Frames messages into batches of at most `max_bytes` (one kernel transaction each),
/// numbering them from `seq`. Returns each batch with the number of acknowledgements due.
pub fn frame(messages: &[Vec<u8>], max_bytes: usize, mut seq: u32) -> Vec<(Vec<u8>, u32)> {
    let mut batches = Vec::new();
    let mut current: Vec<u8> = Vec::new();
    let mut count = 0u32;
    let begin = |seq: u32| {
        message(
            NFNL_MSG_BATCH_BEGIN,
            NLM_F_REQUEST,
            seq,
            0,
            NFNL_SUBSYS_NFTABLES,
            &[],
        )
    };
    let end = |seq: u32| {
        message(
            NFNL_MSG_BATCH_END,
            NLM_F_REQUEST,
            seq,
            0,
            NFNL_SUBSYS_NFTABLES,
            &[],
        )
    };
    for m in messages {
        if count > 0 && current.len() + m.len() + 20 > max_bytes {
            current.extend(end(seq));
            seq = seq.wrapping_add(1);
            batches.push((std::mem::take(&mut current), count));
            count = 0;
        }
        if count == 0 {
            current.extend(begin(seq));
            seq = seq.wrapping_add(1);
        }
        let mut m = m.clone();
        m[8..12].copy_from_slice(&seq.to_ne_bytes());
        seq = seq.wrapping_add(1);
        current.extend(m);
        count += 1;
    }
    if count > 0 {
        current.extend(end(seq));
        batches.push((current, count));
    }
    batches
}

/// Most bytes per batch: well within the default netlink socket send buffer.
const MAX_BATCH_BYTES: usize = 128 * 1024;

/// Sends element changes in the calling thread's network namespace. Each batch (up to
/// 128 KiB of messages) is one kernel transaction; returns once every message of every batch
/// is acknowledged, or with the first error (that batch rolled back, later ones not sent).
pub fn apply(table: &str, changes: &[ElementChange]) -> Result<(), ElementError> {
    use rtnetlink::sys::protocols::NETLINK_NETFILTER;
    use rtnetlink::sys::{Socket, SocketAddr};

    let messages = encode_messages(table, changes)?;
    if messages.is_empty() {
        return Ok(());
    }
    let io = |e: std::io::Error| ElementError::Io(e.to_string());
    let mut socket = Socket::new(NETLINK_NETFILTER).map_err(io)?;
    socket.bind_auto().map_err(io)?;
    socket.connect(&SocketAddr::new(0, 0)).map_err(io)?;
    socket.set_non_blocking(true).map_err(io)?;
    // Acknowledgements without the request echoed back, and room for them.
    let _ = socket.set_cap_ack(true);
    let _ = socket.set_rx_buf_sz(4usize << 20);
    let seq0 = std::process::id().wrapping_shl(12);
    for (batch, expected) in frame(&messages, MAX_BATCH_BYTES, seq0) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match socket.send(&batch, 0) {
                Ok(_) => break,
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_micros(200));
                }
                Err(e) => return Err(io(e)),
            }
        }
        let mut acks = 0u32;
        let mut first_error: Option<String> = None;
        while acks < expected {
            let data = match socket.recv_from_full() {
                Ok((data, _)) => data,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        return Err(ElementError::Io(format!(
                            "timed out waiting for acknowledgements ({acks} of {expected})"
                        )));
                    }
                    std::thread::sleep(Duration::from_micros(100));
                    continue;
                }
                Err(e) => return Err(io(e)),
            };
            let mut off = 0;
            while off + 16 <= data.len() {
                let word =
                    |at: usize| -> [u8; 4] { [data[at], data[at + 1], data[at + 2], data[at + 3]] };
                let len = u32::from_ne_bytes(word(off)) as usize;
                let kind = u16::from_ne_bytes([data[off + 4], data[off + 5]]);
                if len < 16 || off + len > data.len() {
                    break;
                }
                if kind == NLMSG_ERROR && len >= 20 {
                    let code = i32::from_ne_bytes(word(off + 16));
                    acks += 1;
                    if code != 0 && first_error.is_none() {
                        first_error = Some(std::io::Error::from_raw_os_error(-code).to_string());
                    }
                }
                off += (len + 3) & !3;
            }
        }
        if let Some(reason) = first_error {
            return Err(ElementError::Rejected {
                set: changes
                    .iter()
                    .filter(|c| !c.add.is_empty() || !c.delete.is_empty())
                    .map(|c| c.set.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                reason,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_nfts_layout() {
        assert_eq!(
            keys(ElemType::AddrInterval, "10.0.0.0/8").unwrap(),
            vec![(vec![10, 0, 0, 0], 0), (vec![11, 0, 0, 0], 1)]
        );
        assert_eq!(
            keys(ElemType::AddrInterval, "10.1.2.3").unwrap(),
            vec![(vec![10, 1, 2, 3], 0), (vec![10, 1, 2, 4], 1)]
        );
        assert_eq!(
            keys(ElemType::AddrInterval, "255.255.255.255").unwrap(),
            vec![(vec![255, 255, 255, 255], 0)]
        );
        assert_eq!(
            keys(ElemType::AddrProtoPort, "10.0.0.1 . tcp . 8080").unwrap(),
            vec![(vec![10, 0, 0, 1, 6, 0, 0, 0, 0x1f, 0x90, 0, 0], 0)]
        );
        // Service maps: the same concatenation, and the NodePort one without the address.
        assert_eq!(
            ElemType::of_decl("type ipv4_addr . inet_proto . inet_service : verdict;"),
            Some(ElemType::AddrProtoPortVerdict)
        );
        assert_eq!(
            ElemType::of_decl("type inet_proto . inet_service : verdict;"),
            Some(ElemType::ProtoPortVerdict)
        );
        assert_eq!(
            keys(ElemType::AddrProtoPortVerdict, "10.96.0.10 . udp . 53").unwrap(),
            vec![(vec![10, 96, 0, 10, 17, 0, 0, 0, 0, 53, 0, 0], 0)]
        );
        assert_eq!(
            keys(ElemType::ProtoPortVerdict, "tcp . 30080").unwrap(),
            vec![(vec![6, 0, 0, 0, 0x75, 0x80, 0, 0], 0)]
        );
        assert!(keys(ElemType::ProtoPortVerdict, "tcp . 70000").is_err());
        assert!(verdict("goto sc4-abc").is_ok());
        let k = keys(ElemType::Ifname, "\"cali1\"").unwrap();
        assert_eq!(k[0].0.len(), 16);
        assert_eq!(&k[0].0[..5], b"cali1");
        assert!(keys(ElemType::Ifname, "\"a-very-long-interface-name\"").is_err());
    }

    #[test]
    fn batches_are_framed() {
        let change = ElementChange {
            set: "s4-x".into(),
            kind: ElemType::AddrInterval,
            add: vec![("10.0.0.1".into(), None)],
            delete: vec![],
        };
        let msgs = encode_messages("margay", &[change]).unwrap();
        let batches = frame(&msgs, 1 << 20, 1);
        assert_eq!(batches.len(), 1);
        let (bytes, acks) = &batches[0];
        assert_eq!(*acks, 1);
        // Three messages: begin, newsetelem, end; each length field matches.
        let mut off = 0;
        let mut kinds = Vec::new();
        while off < bytes.len() {
            let len = u32::from_ne_bytes(bytes[off..off + 4].try_into().unwrap()) as usize;
            kinds.push(u16::from_ne_bytes(
                bytes[off + 4..off + 6].try_into().unwrap(),
            ));
            off += len;
        }
        assert_eq!(off, bytes.len());
        assert_eq!(kinds, vec![0x10, 0x0a0c, 0x11]);
    }
}
