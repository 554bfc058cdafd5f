//! The shared crate's cheap hasher, for this plugin's maps (std's SipHash was a visible
//! share of a request's cost). The keys are context ids from the host, metric names from the
//! code and the configuration, and price lookups in a map fixed at configure time: a client
//! can make lookups slower at worst, never grow a map, so no flooding defence is needed.

pub use llm_gateway_shared::fxhash::{FxHashMap, FxHashSet};
