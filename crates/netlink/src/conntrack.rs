//! The connection tracking table, dumped over ctnetlink (`NETLINK_NETFILTER`, subsystem
//! `NFNL_SUBSYS_CTNETLINK`): each connection's original and reply tuples, TCP state and —
//! with `net.netfilter.nf_conntrack_acct=1` — its packet and byte counters in both
//! directions. Flow records use it for the traffic of allowed connections (Calico's Felix
//! polls conntrack the same way, every 5 s).
//!
//! A dump is bounded: at most `max_entries` entries and a deadline; what the kernel sends
//! past either is read and thrown away, and the answer says it was cut short.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use rtnetlink::sys::protocols::NETLINK_NETFILTER;
use rtnetlink::sys::{Socket, SocketAddr as NetlinkAddr};

use crate::nfnl::{attrs, message, messages};

const SUBSYS_CTNETLINK: u16 = 1;
const MSG_CT_NEW: u16 = 0;
const MSG_CT_GET: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;

// linux/netfilter/nfnetlink_conntrack.h
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_PROTOINFO: u16 = 4;
const CTA_COUNTERS_ORIG: u16 = 9;
const CTA_COUNTERS_REPLY: u16 = 10;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const CTA_PROTO_ICMP_ID: u16 = 4;
const CTA_PROTO_ICMP_TYPE: u16 = 5;
const CTA_PROTO_ICMP_CODE: u16 = 6;
const CTA_PROTO_ICMPV6_ID: u16 = 7;
const CTA_PROTO_ICMPV6_TYPE: u16 = 8;
const CTA_PROTO_ICMPV6_CODE: u16 = 9;
const CTA_PROTOINFO_TCP: u16 = 1;
const CTA_PROTOINFO_TCP_STATE: u16 = 1;
const CTA_COUNTERS_PACKETS: u16 = 1;
const CTA_COUNTERS_BYTES: u16 = 2;

/// TCP states (`enum tcp_conntrack`) from which a connection counts as ended.
pub const TCP_TIME_WAIT: u8 = 7;
pub const TCP_CLOSE: u8 = 8;

/// One direction of a connection. ICMP's "ports" are Calico's: the echo id as the source
/// port, `type << 8 | code` as the destination port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CtTuple {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: u8,
    pub src_port: u16,
    pub dst_port: u16,
}

/// Packets and bytes of one direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CtCounters {
    pub packets: u64,
    pub bytes: u64,
}

/// One tracked connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtEntry {
    pub orig: CtTuple,
    pub reply: CtTuple,
    /// TCP's state (`enum tcp_conntrack`), for TCP.
    pub tcp_state: Option<u8>,
    /// None when accounting is off (`nf_conntrack_acct=0`).
    pub orig_counters: Option<CtCounters>,
    pub reply_counters: Option<CtCounters>,
}

impl CtEntry {
    /// A TCP connection in TIME_WAIT or CLOSE: it has ended.
    pub fn tcp_ended(&self) -> bool {
        self.tcp_state.is_some_and(|s| s >= TCP_TIME_WAIT)
    }
}

/// How a dump went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DumpStats {
    pub entries: usize,
    /// Entries past `max_entries`, or the deadline reached: the table was not read whole.
    pub truncated: bool,
}

fn be16(v: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(v.get(..2)?.try_into().ok()?))
}

fn be64(v: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(v.get(..8)?.try_into().ok()?))
}

fn parse_tuple(b: &[u8]) -> Option<CtTuple> {
    let (mut src, mut dst, mut proto) = (None, None, None);
    let (mut sport, mut dport) = (0u16, 0u16);
    let (mut icmp_type, mut icmp_code) = (None::<u8>, 0u8);
    for (kind, v) in attrs(b) {
        match kind {
            CTA_TUPLE_IP => {
                for (k, a) in attrs(v) {
                    match k {
                        CTA_IP_V4_SRC | CTA_IP_V4_DST => {
                            let ip: [u8; 4] = a.get(..4)?.try_into().ok()?;
                            let ip = IpAddr::V4(Ipv4Addr::from(ip));
                            if k == CTA_IP_V4_SRC {
                                src = Some(ip)
                            } else {
                                dst = Some(ip)
                            }
                        }
                        CTA_IP_V6_SRC | CTA_IP_V6_DST => {
                            let ip: [u8; 16] = a.get(..16)?.try_into().ok()?;
                            let ip = IpAddr::V6(Ipv6Addr::from(ip));
                            if k == CTA_IP_V6_SRC {
                                src = Some(ip)
                            } else {
                                dst = Some(ip)
                            }
                        }
                        _ => {}
                    }
                }
            }
            CTA_TUPLE_PROTO => {
                for (k, a) in attrs(v) {
                    match k {
                        CTA_PROTO_NUM => proto = a.first().copied(),
                        CTA_PROTO_SRC_PORT => sport = be16(a)?,
                        CTA_PROTO_DST_PORT => dport = be16(a)?,
                        CTA_PROTO_ICMP_ID | CTA_PROTO_ICMPV6_ID => sport = be16(a)?,
                        CTA_PROTO_ICMP_TYPE | CTA_PROTO_ICMPV6_TYPE => {
                            icmp_type = a.first().copied()
                        }
                        CTA_PROTO_ICMP_CODE | CTA_PROTO_ICMPV6_CODE => {
                            icmp_code = a.first().copied().unwrap_or(0)
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    if let Some(t) = icmp_type {
        dport = u16::from(t) << 8 | u16::from(icmp_code);
    }
    Some(CtTuple {
        src: src?,
        dst: dst?,
        proto: proto?,
        src_port: sport,
        dst_port: dport,
    })
}

fn parse_counters(b: &[u8]) -> CtCounters {
    let mut c = CtCounters::default();
    for (k, v) in attrs(b) {
        match k {
            CTA_COUNTERS_PACKETS => c.packets = be64(v).unwrap_or(0),
            CTA_COUNTERS_BYTES => c.bytes = be64(v).unwrap_or(0),
            _ => {}
        }
    }
    c
}

/// One `IPCTNL_MSG_CT_NEW` message's body (nfgenmsg, then attributes); None when it lacks
/// either tuple.
pub fn parse_entry(body: &[u8]) -> Option<CtEntry> {
    let a = body.get(4..)?;
    let (mut orig, mut reply, mut tcp_state) = (None, None, None);
    let (mut oc, mut rc) = (None, None);
    for (kind, v) in attrs(a) {
        match kind {
            CTA_TUPLE_ORIG => orig = parse_tuple(v),
            CTA_TUPLE_REPLY => reply = parse_tuple(v),
            CTA_PROTOINFO => {
                for (k, tcp) in attrs(v) {
                    if k == CTA_PROTOINFO_TCP {
                        tcp_state = attrs(tcp)
                            .find(|(k, _)| *k == CTA_PROTOINFO_TCP_STATE)
                            .and_then(|(_, s)| s.first().copied());
                    }
                }
            }
            CTA_COUNTERS_ORIG => oc = Some(parse_counters(v)),
            CTA_COUNTERS_REPLY => rc = Some(parse_counters(v)),
            _ => {}
        }
    }
    Some(CtEntry {
        orig: orig?,
        reply: reply?,
        tcp_state,
        orig_counters: oc,
        reply_counters: rc,
    })
}

/// Dumps the conntrack table of the calling thread's network namespace (both families),
/// handing each entry to `each`; at most `max_entries` entries, and no longer than `deadline`.
pub fn dump(
    max_entries: usize,
    deadline: Duration,
    mut each: impl FnMut(&CtEntry),
) -> io::Result<DumpStats> {
    let mut sock = Socket::new(NETLINK_NETFILTER)?;
    sock.bind_auto()?;
    sock.connect(&NetlinkAddr::new(0, 0))?;
    let _ = sock.set_rx_buf_sz(1usize << 20);
    let tv = nix::sys::time::TimeVal::new(1, 0);
    nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::ReceiveTimeout, &tv)
        .map_err(io::Error::from)?;
    let seq = 1;
    // nfgenmsg: AF_UNSPEC (every family), version 0, res_id 0.
    let req = message(
        (SUBSYS_CTNETLINK << 8) | MSG_CT_GET,
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
        &[0, 0, 0, 0],
    );
    sock.send(&req, 0)?;
    let start = Instant::now();
    let mut stats = DumpStats::default();
    // Bounded by the deadline: the kernel ends every dump with DONE, but never trust it.
    while start.elapsed() < deadline {
        let (data, _) = match sock.recv_from_full() {
            Ok(d) => d,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "conntrack dump: the kernel stopped answering",
                ));
            }
            Err(e) => return Err(e),
        };
        for (kind, _flags, msg_seq, body) in messages(&data) {
            if msg_seq != seq {
                continue;
            }
            match kind {
                NLMSG_DONE => return Ok(stats),
                NLMSG_ERROR => {
                    let code = body
                        .get(..4)
                        .and_then(|c| c.try_into().ok())
                        .map_or(0, i32::from_ne_bytes);
                    if code != 0 {
                        return Err(io::Error::from_raw_os_error(-code));
                    }
                }
                k if k == (SUBSYS_CTNETLINK << 8) | MSG_CT_NEW => {
                    if stats.entries >= max_entries {
                        stats.truncated = true;
                        continue;
                    }
                    if let Some(e) = parse_entry(body) {
                        stats.entries += 1;
                        each(&e);
                    }
                }
                _ => {}
            }
        }
    }
    stats.truncated = true;
    Ok(stats)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::nfnl::nlattr;

    fn nested(kind: u16, inner: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut body = Vec::new();
        for (k, v) in inner {
            nlattr(&mut body, *k, v);
        }
        let mut out = Vec::new();
        nlattr(&mut out, kind | 0x8000, &body);
        out
    }

    fn tuple(kind: u16, src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        let ip = nested(
            CTA_TUPLE_IP,
            &[(CTA_IP_V4_SRC, src.to_vec()), (CTA_IP_V4_DST, dst.to_vec())],
        );
        let proto = nested(
            CTA_TUPLE_PROTO,
            &[
                (CTA_PROTO_NUM, vec![6]),
                (CTA_PROTO_SRC_PORT, sport.to_be_bytes().to_vec()),
                (CTA_PROTO_DST_PORT, dport.to_be_bytes().to_vec()),
            ],
        );
        let mut inner = ip;
        inner.extend(proto);
        let mut out = Vec::new();
        nlattr(&mut out, kind | 0x8000, &inner);
        out
    }

    fn entry_body() -> Vec<u8> {
        let mut b = vec![2, 0, 0, 0];
        b.extend(tuple(
            CTA_TUPLE_ORIG,
            [10, 0, 0, 1],
            [10, 96, 0, 10],
            40000,
            80,
        ));
        b.extend(tuple(
            CTA_TUPLE_REPLY,
            [10, 0, 0, 9],
            [10, 0, 0, 1],
            8080,
            40000,
        ));
        let tcp = nested(CTA_PROTOINFO_TCP, &[(CTA_PROTOINFO_TCP_STATE, vec![3])]);
        let mut pi = Vec::new();
        nlattr(&mut pi, CTA_PROTOINFO | 0x8000, &tcp);
        b.extend(pi);
        b.extend(nested(
            CTA_COUNTERS_ORIG,
            &[
                (CTA_COUNTERS_PACKETS, 5u64.to_be_bytes().to_vec()),
                (CTA_COUNTERS_BYTES, 300u64.to_be_bytes().to_vec()),
            ],
        ));
        b.extend(nested(
            CTA_COUNTERS_REPLY,
            &[
                (CTA_COUNTERS_PACKETS, 4u64.to_be_bytes().to_vec()),
                (CTA_COUNTERS_BYTES, 9000u64.to_be_bytes().to_vec()),
            ],
        ));
        b
    }

    #[test]
    fn parses_an_entry_as_the_kernel_writes_it() {
        let e = parse_entry(&entry_body()).unwrap();
        assert_eq!(e.orig.src, "10.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(e.orig.dst, "10.96.0.10".parse::<IpAddr>().unwrap());
        assert_eq!(
            (e.orig.src_port, e.orig.dst_port, e.orig.proto),
            (40000, 80, 6)
        );
        assert_eq!(e.reply.src, "10.0.0.9".parse::<IpAddr>().unwrap());
        assert_eq!(e.reply.src_port, 8080);
        assert_eq!(e.tcp_state, Some(3));
        assert!(!e.tcp_ended());
        assert_eq!(
            e.orig_counters,
            Some(CtCounters {
                packets: 5,
                bytes: 300
            })
        );
        assert_eq!(
            e.reply_counters,
            Some(CtCounters {
                packets: 4,
                bytes: 9000
            })
        );
    }

    #[test]
    fn truncated_or_garbled_entries_are_refused_not_misread() {
        let body = entry_body();
        for cut in 0..body.len() {
            // Any prefix either parses to the same orig tuple or to nothing; never a panic.
            if let Some(e) = parse_entry(&body[..cut]) {
                assert_eq!(e.orig.dst_port, 80);
            }
        }
        let mut garbled = body.clone();
        // The first attribute's length runs past the end.
        garbled[4] = 0xff;
        garbled[5] = 0xff;
        assert!(parse_entry(&garbled).is_none());
        assert!(parse_entry(&[]).is_none());
    }
}
