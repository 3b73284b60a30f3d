//! The hard stop of a server that could not drain in time: every live
//! generation is cancelled through its engine handle, so each guest still
//! sees a `finished` event (reason `cancelled`) and ends its response the
//! usual way (the final chunk with `finish_reason` `abort`, then `[DONE]`)
//! instead of being cut mid-stream.

use tokio::sync::watch;

pub struct HardStop {
    tx: watch::Sender<bool>,
}

impl Default for HardStop {
    fn default() -> Self {
        HardStop {
            tx: watch::Sender::new(false),
        }
    }
}

impl HardStop {
    /// Cancels every live generation (and those that start later).
    pub fn fire(&self) {
        self.tx.send_replace(true);
    }

    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.tx.subscribe()
    }
}

/// Resolves once the hard stop fires (never, if it cannot).
pub async fn fired(rx: &mut watch::Receiver<bool>) {
    if rx.wait_for(|stopped| *stopped).await.is_err() {
        std::future::pending::<()>().await;
    }
}
