//! The gateway's one rule for a clock the host cannot read.
//!
//! Envoy answers `proxy_get_current_time_nanoseconds` from its time source and does not fail;
//! a host that does must not send time back to 1970 — a bucket would refill for 56 years, a
//! breaker close, a record carry the epoch. So a failed read is the last good reading of this
//! VM: time stands still until the clock answers again. The one exception is a decision the
//! time *grants*: key-auth's expiry reads the clock itself and, without it, counts every
//! expiring key as expired (it fails closed).

use std::sync::atomic::{AtomicU64, Ordering};

/// The last good reading of one clock (Unix nanoseconds; 0 before the first).
#[derive(Debug, Default)]
pub struct LastGood(AtomicU64);

impl LastGood {
    /// A clock never read.
    pub const fn new() -> LastGood {
        LastGood(AtomicU64::new(0))
    }

    /// `read` if it answered (kept as the last good reading), else the last good reading.
    pub fn hold<E>(&self, read: Result<u64, E>) -> u64 {
        match read {
            Ok(nanos) => {
                self.0.store(nanos, Ordering::Relaxed);
                nanos
            }
            Err(_) => self.0.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn a_failed_read_is_the_last_good_one_and_time_resumes_with_the_clock() {
        let clock = LastGood::new();
        assert_eq!(clock.hold::<()>(Err(())), 0, "never read: nothing to hold");
        assert_eq!(clock.hold::<()>(Ok(5_000)), 5_000);
        assert_eq!(clock.hold(Err("down")), 5_000);
        assert_eq!(clock.hold(Err("down")), 5_000);
        assert_eq!(clock.hold::<()>(Ok(9_000)), 9_000);
        assert_eq!(clock.hold(Err("down")), 9_000);
    }
}
