//! The flow a logged packet belongs to, from the start of its network-layer header.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

/// A connection's identity. For ICMP the source "port" is the echo id and the destination
/// "port" is `type << 8 | code`, as Calico's flow logs write them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Tuple {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: u8,
    pub src_port: u16,
    pub dst_port: u16,
}

/// Calico's protocol names.
pub fn proto_name(proto: u8) -> String {
    match proto {
        1 => "icmp".into(),
        6 => "tcp".into(),
        17 => "udp".into(),
        4 => "ipip".into(),
        50 => "esp".into(),
        58 => "icmp6".into(),
        132 => "sctp".into(),
        n => n.to_string(),
    }
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// The tuple of an IPv4 or IPv6 packet (`None` when the bytes are not one). A later fragment
/// or a header cut short by the snaplen has ports 0.
pub fn tuple(payload: &[u8]) -> Option<Tuple> {
    let version = payload.first()? >> 4;
    let (src, dst, proto, l4, later_fragment) = match version {
        4 => {
            let ihl = usize::from(payload.first()? & 0x0f) * 4;
            if ihl < 20 || payload.len() < 20 {
                return None;
            }
            let frag = be16(payload, 6)? & 0x1fff;
            let src: [u8; 4] = payload.get(12..16)?.try_into().ok()?;
            let dst: [u8; 4] = payload.get(16..20)?.try_into().ok()?;
            (
                IpAddr::V4(Ipv4Addr::from(src)),
                IpAddr::V4(Ipv4Addr::from(dst)),
                *payload.get(9)?,
                payload.get(ihl..).unwrap_or_default(),
                frag != 0,
            )
        }
        6 => {
            let src: [u8; 16] = payload.get(8..24)?.try_into().ok()?;
            let dst: [u8; 16] = payload.get(24..40)?.try_into().ok()?;
            // Extension headers are not followed: their transport shows as its number.
            (
                IpAddr::V6(Ipv6Addr::from(src)),
                IpAddr::V6(Ipv6Addr::from(dst)),
                *payload.get(6)?,
                payload.get(40..).unwrap_or_default(),
                false,
            )
        }
        _ => return None,
    };
    let (src_port, dst_port) = if later_fragment {
        (0, 0)
    } else {
        match proto {
            6 | 17 | 132 | 136 => (be16(l4, 0).unwrap_or(0), be16(l4, 2).unwrap_or(0)),
            1 | 58 => {
                let ty = u16::from(l4.first().copied().unwrap_or(0));
                let code = u16::from(l4.get(1).copied().unwrap_or(0));
                (be16(l4, 4).unwrap_or(0), ty << 8 | code)
            }
            _ => (0, 0),
        }
    };
    Some(Tuple {
        src,
        dst,
        proto,
        src_port,
        dst_port,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn v4(proto: u8, l4: &[u8]) -> Vec<u8> {
        let mut p = vec![
            0x45, 0, 0, 0, 0, 0, 0, 0, 64, proto, 0, 0, 10, 0, 0, 2, 10, 0, 0, 9,
        ];
        p.extend_from_slice(l4);
        p
    }

    #[test]
    fn tcp_udp_icmp_and_fragments() {
        let t = tuple(&v4(6, &[0x30, 0x39, 0, 80, 0, 0, 0, 0])).unwrap();
        assert_eq!(
            (
                t.src.to_string(),
                t.dst.to_string(),
                t.proto,
                t.src_port,
                t.dst_port
            ),
            ("10.0.0.2".into(), "10.0.0.9".into(), 6, 12345, 80)
        );
        let t = tuple(&v4(17, &[0, 53, 0, 53])).unwrap();
        assert_eq!((t.src_port, t.dst_port), (53, 53));
        // Echo request (type 8 code 0), id 0x0102.
        let t = tuple(&v4(1, &[8, 0, 0, 0, 1, 2, 0, 1])).unwrap();
        assert_eq!((t.src_port, t.dst_port), (0x0102, 8 << 8));
        let mut frag = v4(6, &[0x30, 0x39, 0, 80]);
        frag[7] = 8;
        assert_eq!(tuple(&frag).unwrap().dst_port, 0);
        // Cut short: ports 0, no panic.
        assert_eq!(tuple(&v4(6, &[0x30])).unwrap().src_port, 0);
        assert_eq!(proto_name(6), "tcp");
        assert_eq!(proto_name(99), "99");
    }

    #[test]
    fn ipv6_and_garbage() {
        let mut p = vec![0x60, 0, 0, 0, 0, 8, 17, 64];
        p.extend_from_slice(&"fd00::1".parse::<Ipv6Addr>().unwrap().octets());
        p.extend_from_slice(&"fd00::2".parse::<Ipv6Addr>().unwrap().octets());
        p.extend_from_slice(&[0x04, 0xd2, 0x00, 0x35]);
        let t = tuple(&p).unwrap();
        assert_eq!(
            (t.dst.to_string(), t.src_port, t.dst_port),
            ("fd00::2".into(), 1234, 53)
        );
        for bad in [&[][..], &[0x45], &[0x41; 20], &[0x70; 60]] {
            assert!(tuple(bad).is_none() || bad.len() >= 20);
        }
        assert!(tuple(&[0x45; 10]).is_none());
    }
}
