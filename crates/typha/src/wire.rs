//! Reading and writing frames on a byte stream (async), with the protocol's limits.

use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::proto::{self, Message, ProtoError};

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("connection closed")]
    Closed,
    #[error("connection closed in the middle of a frame (truncated frame)")]
    Truncated,
    #[error("malformed frame: {0}")]
    Malformed(#[from] ProtoError),
    #[error("read failed: {0}")]
    Io(std::io::Error),
    #[error("nothing received for {0:?}")]
    Timeout(Duration),
}

/// Reads one frame (at most `max` payload bytes).
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R, max: usize) -> Result<Message, ReadError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..]).await {
            Ok(0) if got == 0 => return Err(ReadError::Closed),
            Ok(0) => return Err(ReadError::Truncated),
            Ok(n) => got += n,
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
    let h = proto::parse_len(len, max)?;
    let mut body = vec![0u8; h.len];
    match r.read_exact(&mut body).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(ReadError::Truncated);
        }
        Err(e) => return Err(ReadError::Io(e)),
    }
    Ok(proto::decode_body(Bytes::from(body), max)?)
}

/// Reads one frame within `timeout`.
pub async fn read_frame_timeout<R: AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
    timeout: Duration,
) -> Result<Message, ReadError> {
    match tokio::time::timeout(timeout, read_frame(r, max)).await {
        Ok(r) => r,
        Err(_) => Err(ReadError::Timeout(timeout)),
    }
}

/// Why a write failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("write did not complete within {0:?} (the peer is not reading)")]
    Timeout(Duration),
    #[error("write failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Writes one encoded frame within `timeout`.
pub async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    frame: &[u8],
    timeout: Duration,
) -> Result<(), WriteError> {
    match tokio::time::timeout(timeout, async {
        w.write_all(frame).await?;
        w.flush().await
    })
    .await
    {
        Ok(r) => Ok(r?),
        Err(_) => Err(WriteError::Timeout(timeout)),
    }
}

/// Writes several frames, each within `timeout`; flushes once at the end.
pub async fn write_frames<W: AsyncWrite + Unpin>(
    w: &mut W,
    frames: &[Bytes],
    timeout: Duration,
) -> Result<(), WriteError> {
    for f in frames {
        match tokio::time::timeout(timeout, w.write_all(f)).await {
            Ok(r) => r?,
            Err(_) => return Err(WriteError::Timeout(timeout)),
        }
    }
    match tokio::time::timeout(timeout, w.flush()).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(WriteError::Timeout(timeout)),
    }
}
