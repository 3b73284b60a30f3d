//! Qwasi's default request policy, a `qwasi:inference/policy` component.
//!
//! The logic lives in [`policy`] (plain Rust, unit-tested natively); this file
//! only binds it to the WIT world, and only when building for wasm32.

pub mod policy;

#[cfg(target_arch = "wasm32")]
mod component {
    wit_bindgen::generate!({
        world: "policy",
        path: "../../wit",
    });

    use crate::policy;
    use exports::qwasi::inference::admission::{Decision, Denial, Guest, RequestMeta};
    use qwasi::inference::{policy_config, policy_state};

    struct Component;

    /// The host-kept counters of `policy-state`, shared by all instances.
    struct HostCounter;

    impl policy::RateCounter for HostCounter {
        fn incr(&self, key: &str, window_secs: u32) -> (u64, u32) {
            let c = policy_state::incr(key, window_secs);
            (c.count, c.reset_after)
        }
    }

    impl Guest for Component {
        fn check(request: RequestMeta) -> Decision {
            let settings = policy_config::settings();
            let req = policy::Request {
                method: &request.method,
                path: &request.path,
                headers: &request.headers,
                remote_addr: &request.remote_addr,
            };
            match policy::decide(&settings, &req, Some(&HostCounter)) {
                policy::Decision::Allow(caller) => Decision::Allow(caller),
                policy::Decision::Deny(d) => Decision::Deny(Denial {
                    status: d.status,
                    code: d.code,
                    message: d.message,
                    retry_after: d.retry_after,
                }),
            }
        }
    }

    export!(Component);
}
