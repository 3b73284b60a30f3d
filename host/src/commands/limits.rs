//! `qwasi serve`'s limits on what one client can hold: body size and
//! time, pending bodies, connections, and the guest memory sized from the
//! body limit (docs/SECURITY.md).

use super::serve::{parse_duration, parse_size};
use crate::server::{self, conn};
use anyhow::{Result, bail};
use std::time::Duration;

#[derive(clap::Args, Clone, Debug)]
pub struct LimitArgs {
    /// Linear-memory cap per guest instance (e.g. 64MiB, 1GiB; default: 16
    /// times --max-body-size, so every body under the limit can be parsed).
    #[arg(long, value_parser = parse_size)]
    pub guest_memory: Option<usize>,
    /// Largest request body (413 beyond), read by the host before a guest runs.
    #[arg(long, default_value = "32MiB", value_parser = parse_size)]
    pub max_body_size: usize,
    /// Time a client has to send a request's head, and then its whole body (408 beyond).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub body_timeout: Duration,
    /// Requests whose body is still arriving, in all (503 server_busy beyond).
    #[arg(long, default_value_t = 256)]
    pub max_pending_bodies: usize,
    /// Requests whose body is still arriving, per client: API key, or address
    /// without keys (429 too_many_pending_requests beyond).
    #[arg(long, default_value_t = 32)]
    pub max_pending_bodies_per_client: usize,
    /// Connections served at once (503 too_many_connections beyond; default:
    /// 1024, or fewer if the open-file limit is lower).
    #[arg(long)]
    pub max_connections: Option<usize>,
}

/// `--max-connections` without the flag (if the open-file limit allows).
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

impl LimitArgs {
    /// Refuses limits the server cannot keep.
    pub fn check(&self) -> Result<()> {
        if self.max_body_size == 0
            || self.max_pending_bodies == 0
            || self.max_pending_bodies_per_client == 0
        {
            bail!(
                "--max-body-size, --max-pending-bodies and --max-pending-bodies-per-client must be above 0"
            );
        }
        self.connections().map(|_| ())
    }

    /// `--max-connections`, or its default, checked against the open-file
    /// limit (raised to its hard limit first).
    pub fn connections(&self) -> Result<usize> {
        let fds = conn::raise_fd_limit();
        let most = conn::max_for_fd_limit(fds);
        match self.max_connections {
            Some(0) => bail!("--max-connections must be at least 1"),
            Some(n) if n > most => bail!(
                "--max-connections {n} does not fit the open-file limit ({fds}): at most {most} \
                 (each connection, served or refused, needs a descriptor and {} stay free); raise `ulimit -n` or lower it",
                conn::RESERVED_FDS
            ),
            Some(n) => Ok(n),
            None if most == 0 => {
                bail!("the open-file limit ({fds}) is too low to serve; raise `ulimit -n`")
            }
            None => Ok(most.min(DEFAULT_MAX_CONNECTIONS)),
        }
    }

    /// `--guest-memory`, or its default: 16 times the body limit, at least 64 MiB.
    pub fn guest_memory(&self) -> usize {
        self.guest_memory
            .unwrap_or_else(|| self.max_body_size.saturating_mul(16).max(64 << 20))
    }

    pub fn server_limits(&self) -> Result<server::Limits> {
        Ok(server::Limits {
            max_body: self.max_body_size,
            body_timeout: self.body_timeout,
            max_pending_bodies: self.max_pending_bodies,
            max_pending_per_client: self.max_pending_bodies_per_client,
            max_connections: self.connections()?,
        })
    }
}
