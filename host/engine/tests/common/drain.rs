//! Draining a request's handle, shared by the service and batching tests
//! (included by path where used, so other test binaries do not compile it).

use qwasi_engine::service::{Event, GenerationHandle};
use std::time::Duration;

/// Every event of the handle up to its terminal one; fails the test after
/// `limit` (a stuck request) or when a wake-up brings nothing to take.
pub async fn drain(h: &mut GenerationHandle, limit: Duration) -> Vec<Event> {
    let all = async {
        let mut all = Vec::new();
        loop {
            h.wait().await;
            let evs = h.try_next();
            assert!(!evs.is_empty(), "wait() resolved with nothing to take");
            let done = evs.iter().any(Event::is_terminal);
            all.extend(evs);
            if done {
                return all;
            }
        }
    };
    tokio::time::timeout(limit, all)
        .await
        .expect("request did not finish")
}
