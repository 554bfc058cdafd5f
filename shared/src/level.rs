//! The one log level: what a core says of its log lines and what the host's `proxy_log` takes
//! (its numbers are the ABI's).

/// A log line's level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// 0
    Trace = 0,
    /// 1
    Debug = 1,
    /// 2: normal operation worth a line (a breaker probing or closing, a fallback pass).
    Info = 2,
    /// 3: something degraded.
    Warn = 3,
    /// 4: a host call that should not fail failed.
    Error = 4,
    /// 5
    Critical = 5,
}
