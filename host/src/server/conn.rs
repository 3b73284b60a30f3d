//! The connection limit: at most `--max-connections` connections are served
//! at once (kept below the file-descriptor limit); a connection beyond it gets
//! a short `503 too_many_connections` and is closed, and beyond twice the
//! limit it is closed at once, so that no flood can use up the descriptors
//! the server needs for its own files and for `/health`.

use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// File descriptors kept free for the server itself (model files, guest
/// files, logs, the compile cache).
pub const RESERVED_FDS: u64 = 64;

pub struct Connections {
    served: Arc<Semaphore>,
    refused: Arc<Semaphore>,
    max: usize,
}

/// What to do with a new connection.
pub enum Admission {
    Serve(OwnedSemaphorePermit),
    Refuse(OwnedSemaphorePermit),
    Drop,
}

impl Connections {
    pub fn new(max: usize) -> Self {
        Connections {
            served: Arc::new(Semaphore::new(max)),
            refused: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    pub fn admit(&self) -> Admission {
        if let Ok(p) = self.served.clone().try_acquire_owned() {
            return Admission::Serve(p);
        }
        match self.refused.clone().try_acquire_owned() {
            Ok(p) => Admission::Refuse(p),
            Err(_) => Admission::Drop,
        }
    }

    /// Connections being served now.
    pub fn open(&self) -> usize {
        self.max - self.served.available_permits()
    }
}

/// Answers `503 too_many_connections` and closes: reads the request head
/// first (briefly), so that closing does not reset the connection before the
/// client reads the answer.
pub async fn refuse(mut stream: TcpStream, max: usize, _permit: OwnedSemaphorePermit) {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    let read_head = async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 << 10 {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), read_head).await;
    let body = serde_json::json!({"type": "error", "error": {
        "message": format!("the server has too many open connections (at most {max}, --max-connections); retry shortly"),
        "type": "server_error", "param": null, "code": "too_many_connections"}})
    .to_string();
    let resp = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let write = async {
        stream.write_all(resp.as_bytes()).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), write).await;
}

/// Raises the soft limit on open files to the hard limit; returns the limit
/// now in force.
#[cfg(unix)]
pub fn raise_fd_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    lim.rlim_cur
}

/// Windows has no per-process descriptor limit of this kind: the sockets a
/// process may open are bounded by memory.
#[cfg(not(unix))]
pub fn raise_fd_limit() -> u64 {
    1 << 16
}

/// The most connections `fd_limit` allows: each served connection and each
/// refused one holds a descriptor, and [`RESERVED_FDS`] stay free.
pub fn max_for_fd_limit(fd_limit: u64) -> usize {
    (fd_limit.saturating_sub(RESERVED_FDS) / 2) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fd_budget() {
        assert_eq!(max_for_fd_limit(1024), 480);
        assert_eq!(max_for_fd_limit(10), 0);
        let c = Connections::new(1);
        let served = c.admit();
        assert!(matches!(served, Admission::Serve(_)));
        assert_eq!(c.open(), 1);
        let refused = c.admit();
        assert!(matches!(refused, Admission::Refuse(_)));
        assert!(matches!(c.admit(), Admission::Drop));
        drop((served, refused));
        assert!(matches!(c.admit(), Admission::Serve(_)));
    }
}
