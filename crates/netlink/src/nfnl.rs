//! nfnetlink framing shared by the NFLOG and conntrack sockets: attributes written and read
//! without trusting any length the buffer claims.

/// Appends one attribute (type, value, padding to 4 bytes).
pub(crate) fn nlattr(out: &mut Vec<u8>, kind: u16, value: &[u8]) {
    let len = 4 + value.len();
    out.extend_from_slice(&u16::try_from(len).unwrap_or(u16::MAX).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(value);
    out.resize(out.len() + (4 - len % 4) % 4, 0);
}

pub(crate) fn read_u16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

pub(crate) fn read_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The attributes in `b`: (type without the nested/byte-order flags, value). Stops at the
/// first malformed one.
pub(crate) fn attrs(b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut off = 0;
    std::iter::from_fn(move || {
        let len = usize::from(read_u16(b, off)?);
        let kind = read_u16(b, off + 2)? & 0x3fff;
        if len < 4 || off + len > b.len() {
            return None;
        }
        let value = &b[off + 4..off + len];
        off += (len + 3) & !3;
        Some((kind, value))
    })
}

/// The netlink messages in one datagram: (type, flags, sequence, payload after the 16-byte
/// header). Stops at the first malformed one.
pub(crate) fn messages(datagram: &[u8]) -> impl Iterator<Item = (u16, u16, u32, &[u8])> {
    let mut off = 0;
    std::iter::from_fn(move || {
        let len = read_u32(datagram, off)? as usize;
        if len < 16 || off + len > datagram.len() {
            return None;
        }
        let kind = read_u16(datagram, off + 4)?;
        let flags = read_u16(datagram, off + 6)?;
        let seq = read_u32(datagram, off + 8)?;
        let body = &datagram[off + 16..off + len];
        off += (len + 3) & !3;
        Some((kind, flags, seq, body))
    })
}

/// A netlink message: header (type, flags, sequence, port 0) and `body`.
pub(crate) fn message(kind: u16, flags: u16, seq: u32, body: &[u8]) -> Vec<u8> {
    let len = 16 + body.len();
    let mut msg = Vec::with_capacity(len);
    msg.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_ne_bytes());
    msg.extend_from_slice(&kind.to_ne_bytes());
    msg.extend_from_slice(&flags.to_ne_bytes());
    msg.extend_from_slice(&seq.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(body);
    msg
}
