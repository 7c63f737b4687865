//! NFLOG (nfnetlink_log): the packets that nftables rules hand to a log group (`log group N
//! prefix "…"`), read over a `NETLINK_NETFILTER` socket. This is how a dataplane learns which
//! rule decided a connection: the rule's prefix names it, the packet's headers name the flow.
//!
//! One [`Nflog`] binds one group in the network namespace of the thread that opened it. The
//! kernel queues packets in the socket's receive buffer; when it is full the kernel drops them
//! and the next read fails with ENOBUFS, which is counted ([`Nflog::overruns`]), never fatal.

use std::io;
use std::time::Duration;

use rtnetlink::sys::protocols::NETLINK_NETFILTER;
use rtnetlink::sys::{Socket, SocketAddr as NetlinkAddr};

use crate::nfnl::{message, nlattr, read_u16, read_u32};

/// nfnetlink subsystem of the log (`NFNL_SUBSYS_ULOG`).
const SUBSYS_ULOG: u16 = 4;
const MSG_PACKET: u16 = 0;
const MSG_CONFIG: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;

// Configuration attributes and commands (linux/netfilter/nfnetlink_log.h).
const CFG_CMD: u16 = 1;
const CFG_MODE: u16 = 2;
const CFG_NLBUFSIZ: u16 = 3;
const CFG_TIMEOUT: u16 = 4;
const CMD_BIND: u8 = 1;
const CMD_UNBIND: u8 = 2;
const COPY_PACKET: u8 = 2;

// Packet attributes.
const ATTR_PACKET_HDR: u16 = 1;
const ATTR_IFINDEX_INDEV: u16 = 4;
const ATTR_IFINDEX_OUTDEV: u16 = 5;
const ATTR_PAYLOAD: u16 = 9;
const ATTR_PREFIX: u16 = 10;

/// Longest prefix kept (the kernel's limit is 64 bytes with the NUL).
const MAX_PREFIX: usize = 128;

/// One logged packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NflogPacket {
    /// The log group it was sent to.
    pub group: u16,
    /// The rule's `prefix`.
    pub prefix: String,
    /// The link-layer protocol (0x0800 IPv4, 0x86dd IPv6), when the kernel said.
    pub hw_protocol: Option<u16>,
    /// The netfilter hook (0 prerouting, 1 input, 2 forward, 3 output, 4 postrouting).
    pub hook: Option<u8>,
    pub indev: Option<u32>,
    pub outdev: Option<u32>,
    /// The start of the network-layer packet (as much as the rule's snaplen and the group's
    /// copy range allow).
    pub payload: Vec<u8>,
}

/// A socket bound to one NFLOG group.
pub struct Nflog {
    sock: Socket,
    group: u16,
    seq: u32,
    overruns: u64,
}

impl std::fmt::Debug for Nflog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nflog")
            .field("group", &self.group)
            .field("overruns", &self.overruns)
            .finish()
    }
}

/// One configuration message for `group` with the given attributes.
fn config_message(seq: u32, group: u16, attrs: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let mut body = Vec::new();
    // nfgenmsg: family AF_UNSPEC, version 0, res_id = the group (big endian).
    body.extend_from_slice(&[0, 0]);
    body.extend_from_slice(&group.to_be_bytes());
    for (k, v) in attrs {
        nlattr(&mut body, *k, v);
    }
    message(
        (SUBSYS_ULOG << 8) | MSG_CONFIG,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        &body,
    )
}

/// The packets in one datagram from the socket; anything malformed is skipped (the kernel
/// is the only sender, but a reader must never trust lengths).
pub fn parse(datagram: &[u8]) -> Vec<NflogPacket> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + 16 <= datagram.len() {
        let Some(len) = read_u32(datagram, off).map(|l| l as usize) else {
            break;
        };
        let kind = read_u16(datagram, off + 4).unwrap_or(0);
        if len < 16 || off + len > datagram.len() {
            break;
        }
        if kind == (SUBSYS_ULOG << 8) | MSG_PACKET
            && let Some(p) = parse_packet(&datagram[off + 16..off + len])
        {
            out.push(p);
        }
        off += (len + 3) & !3;
    }
    out
}

fn parse_packet(body: &[u8]) -> Option<NflogPacket> {
    // nfgenmsg, then attributes.
    let group = u16::from_be_bytes([*body.get(2)?, *body.get(3)?]);
    let mut p = NflogPacket {
        group,
        prefix: String::new(),
        hw_protocol: None,
        hook: None,
        indev: None,
        outdev: None,
        payload: Vec::new(),
    };
    let mut off = 4;
    while off + 4 <= body.len() {
        let len = usize::from(read_u16(body, off)?);
        let kind = read_u16(body, off + 2)? & 0x3fff;
        if len < 4 || off + len > body.len() {
            break;
        }
        let value = &body[off + 4..off + len];
        let be32 = || -> Option<u32> {
            Some(u32::from_be_bytes([
                *value.first()?,
                *value.get(1)?,
                *value.get(2)?,
                *value.get(3)?,
            ]))
        };
        match kind {
            ATTR_PACKET_HDR => {
                p.hw_protocol = Some(u16::from_be_bytes([*value.first()?, *value.get(1)?]));
                p.hook = value.get(2).copied();
            }
            ATTR_IFINDEX_INDEV => p.indev = be32(),
            ATTR_IFINDEX_OUTDEV => p.outdev = be32(),
            ATTR_PAYLOAD => p.payload = value.to_vec(),
            ATTR_PREFIX => {
                let text = value.split(|b| *b == 0).next().unwrap_or_default();
                let text = &text[..text.len().min(MAX_PREFIX)];
                p.prefix = String::from_utf8_lossy(text).into_owned();
            }
            _ => {}
        }
        off += (len + 3) & !3;
    }
    Some(p)
}

impl Nflog {
    /// Binds `group` in the calling thread's network namespace, asking for the first
    /// `copy_bytes` of each packet. Fails (EBUSY) when another process has the group.
    pub fn bind(group: u16, copy_bytes: u16) -> io::Result<Nflog> {
        let mut sock = Socket::new(NETLINK_NETFILTER)?;
        sock.bind_auto()?;
        sock.connect(&NetlinkAddr::new(0, 0))?;
        // Room for bursts: what does not fit is dropped by the kernel and counted here.
        let _ = sock.set_rx_buf_sz(1usize << 20);
        let mut n = Nflog {
            sock,
            group,
            seq: 0,
            overruns: 0,
        };
        n.set_timeout(Duration::from_secs(5))?;
        n.configure(&[(CFG_CMD, vec![CMD_BIND])]).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot bind NFLOG group {group}: {e} (is another process reading it?)"),
            )
        })?;
        let mut mode = u32::from(copy_bytes).to_be_bytes().to_vec();
        mode.extend_from_slice(&[COPY_PACKET, 0]);
        n.configure(&[
            (CFG_MODE, mode),
            // Batch up to 10 ms in the kernel (Calico's NFLOG aggregation) and 64 KiB.
            (CFG_TIMEOUT, 1u32.to_be_bytes().to_vec()),
            (CFG_NLBUFSIZ, 65_536u32.to_be_bytes().to_vec()),
        ])?;
        Ok(n)
    }

    pub fn group(&self) -> u16 {
        self.group
    }

    /// Datagrams the kernel could not queue (ENOBUFS seen) since the socket was opened.
    pub fn overruns(&self) -> u64 {
        self.overruns
    }

    fn set_timeout(&mut self, t: Duration) -> io::Result<()> {
        let micros = i64::try_from(t.as_micros()).unwrap_or(i64::MAX).max(1);
        let tv = nix::sys::time::TimeVal::new(micros / 1_000_000, micros % 1_000_000);
        nix::sys::socket::setsockopt(&self.sock, nix::sys::socket::sockopt::ReceiveTimeout, &tv)
            .map_err(io::Error::from)
    }

    /// Sends one configuration message and waits for its acknowledgement (packets that
    /// arrive meanwhile are dropped: configuration happens before any are expected).
    fn configure(&mut self, attrs: &[(u16, Vec<u8>)]) -> io::Result<()> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        self.sock.send(&config_message(seq, self.group, attrs), 0)?;
        for _ in 0..64 {
            let (data, _) = self.sock.recv_from_full()?;
            let mut off = 0;
            while off + 16 <= data.len() {
                let len = read_u32(&data, off).map_or(0, |l| l as usize);
                let kind = read_u16(&data, off + 4).unwrap_or(0);
                let msg_seq = read_u32(&data, off + 8).unwrap_or(0);
                if len < 16 || off + len > data.len() {
                    break;
                }
                if kind == NLMSG_ERROR && msg_seq == seq && len >= 20 {
                    let code = read_u32(&data, off + 16).map_or(0, |c| c as i32);
                    return if code == 0 {
                        Ok(())
                    } else {
                        Err(io::Error::from_raw_os_error(-code))
                    };
                }
                off += (len + 3) & !3;
            }
        }
        Err(io::Error::other(
            "nflog: no acknowledgement from the kernel",
        ))
    }

    /// Waits up to `timeout` for logged packets; returns those of one datagram (empty after
    /// the timeout).
    pub fn recv(&mut self, timeout: Duration) -> io::Result<Vec<NflogPacket>> {
        self.set_timeout(timeout)?;
        match self.sock.recv_from_full() {
            Ok((data, _)) => Ok(parse(&data)),
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut =>
            {
                Ok(Vec::new())
            }
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOBUFS) => {
                self.overruns += 1;
                Ok(Vec::new())
            }
            Err(e) => Err(e),
        }
    }
}

impl Drop for Nflog {
    fn drop(&mut self) {
        // Unbind so the group is free for the next reader (the kernel also frees it when the
        // socket closes).
        self.seq = self.seq.wrapping_add(1);
        let _ = self.sock.send(
            &config_message(self.seq, self.group, &[(CFG_CMD, vec![CMD_UNBIND])]),
            0,
        );
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A packet message as the kernel writes it.
    fn packet_message(group: u16, prefix: &str, payload: &[u8]) -> Vec<u8> {
        let mut body = vec![2, 0];
        body.extend_from_slice(&group.to_be_bytes());
        nlattr(&mut body, ATTR_PACKET_HDR, &[0x08, 0x00, 2, 0]);
        nlattr(&mut body, ATTR_IFINDEX_INDEV, &7u32.to_be_bytes());
        let mut p = prefix.as_bytes().to_vec();
        p.push(0);
        nlattr(&mut body, ATTR_PREFIX, &p);
        nlattr(&mut body, ATTR_PAYLOAD, payload);
        let len = 16 + body.len();
        let mut msg = (len as u32).to_ne_bytes().to_vec();
        msg.extend_from_slice(&((SUBSYS_ULOG << 8) | MSG_PACKET).to_ne_bytes());
        msg.extend_from_slice(&[0; 10]);
        msg.extend_from_slice(&body);
        msg
    }

    #[test]
    fn parses_packets_and_skips_what_is_malformed() {
        let mut dgram = packet_message(1, "API0|gnp/allow-ssh", &[0x45, 0, 0, 20]);
        dgram.extend(packet_message(2, "DRE", &[0x45; 40]));
        let got = parse(&dgram);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].prefix, "API0|gnp/allow-ssh");
        assert_eq!(got[0].group, 1);
        assert_eq!(got[0].hw_protocol, Some(0x0800));
        assert_eq!(got[0].hook, Some(2));
        assert_eq!(got[0].indev, Some(7));
        assert_eq!(got[0].payload, [0x45, 0, 0, 20]);
        assert_eq!(got[1].group, 2);
        assert_eq!(got[1].payload.len(), 40);
        // Truncated or lying lengths: no panic, nothing invented.
        for cut in 0..dgram.len() {
            let _ = parse(&dgram[..cut]);
        }
        let mut lying = packet_message(1, "X", &[1, 2, 3]);
        lying[0] = 0xff;
        assert!(parse(&lying).is_empty());
        assert!(parse(&[0u8; 3]).is_empty());
    }

    #[test]
    fn config_messages_carry_the_group_big_endian() {
        let m = config_message(9, 0x0102, &[(CFG_CMD, vec![CMD_BIND])]);
        assert_eq!(read_u32(&m, 0).unwrap() as usize, m.len());
        assert_eq!(read_u16(&m, 4).unwrap(), (SUBSYS_ULOG << 8) | MSG_CONFIG);
        assert_eq!(&m[18..20], &[1, 2]);
        assert_eq!(read_u16(&m, 22).unwrap(), CFG_CMD);
        assert_eq!(m[24], CMD_BIND);
        assert_eq!(m.len() % 4, 0);
    }
}
