//! The stages' edits written back to the host once, when a direction's headers or data go on,
//! and what the callback answers then.

use super::request::{maps, Fused, PLUGIN};
use llm_gateway_shared::chain::{self, Direction, Outcome};
use llm_gateway_shared::host::{self, LogLevel};
use llm_gateway_shared::reject::Reject;
use proxy_wasm::types::Action;

impl Fused {
    pub(super) fn held(&self, direction: Direction) -> bool {
        match direction {
            Direction::Request => self.request_held,
            Direction::Response => self.response_held,
        }
    }

    pub(super) fn set_held(&mut self, direction: Direction, held: bool) {
        match direction {
            Direction::Request => self.request_held = held,
            Direction::Response => self.response_held = held,
        }
    }

    /// What the callback returns for the engine's `outcome`; on `Continue` the stages' edits
    /// are written to the host first.
    pub(super) fn finish(&mut self, direction: Direction, outcome: Outcome) -> Action {
        let action = match outcome {
            Outcome::Continue => match self.write(direction) {
                Ok(()) => Action::Continue,
                Err(reject) => {
                    host::refuse(PLUGIN, &reject);
                    Action::Pause
                }
            },
            Outcome::Pause | Outcome::Stop => Action::Pause,
        };
        if action == Action::Continue {
            self.set_held(direction, false);
        }
        action
    }

    /// Writes the header edits and the changed data of `direction`.
    pub(super) fn write(&mut self, direction: Direction) -> Result<(), Reject> {
        let (map, buffer) = maps(direction);
        // a new request body while the headers are held: its `content-length` follows (when
        // the request has one), written with the other header edits
        if self.x.data_changed && direction == Direction::Request && self.held(direction) {
            frame(&mut self.x.request, self.x.data.len());
        }
        let headers = match direction {
            Direction::Request => &mut self.x.request,
            Direction::Response => &mut self.x.response,
        };
        if headers.edited() {
            let edits = headers.take_edits();
            let written = if edits.cheaper_as_one_map(headers.pairs().len()) {
                host::set_headers(map, headers.pairs()).map_err(|err| ("(all)".to_string(), err))
            } else {
                host::write_edits(map, &edits)
            };
            if let Err((name, err)) = written {
                host::log(
                    LogLevel::Error,
                    &format!("llm-gateway: cannot write header {name}: {err}"),
                );
                return Err(Reject::internal("cannot prepare the request"));
            }
        }
        if self.x.clear_route_cache {
            // after the headers the route depends on are written
            self.x.clear_route_cache = false;
            if let Err(err) = host::clear_route_cache() {
                host::log(
                    LogLevel::Error,
                    &format!("llm-gateway: cannot clear the route cache: {err}"),
                );
                return Err(Reject::internal("cannot route the request"));
            }
        }
        if self.x.data_changed {
            self.x.data_changed = false;
            if let Err(err) = host::set_buffer(buffer, 0, self.size, &self.x.data) {
                host::log(
                    LogLevel::Error,
                    &format!("llm-gateway: cannot replace the body: {err}"),
                );
                // never forward what a stage could not change (unredacted data)
                return Err(Reject::internal("cannot rewrite the body"));
            }
        }
        Ok(())
    }
}

/// Frames a new request body of `length` bytes, as `host::replace_request_body` does: a
/// request with `content-length` gets the new length and no `transfer-encoding`. Known from
/// the headers held, so nothing is read from the host and a header already right is not
/// written.
fn frame(request: &mut chain::Headers, length: usize) {
    if request.get("content-length").is_some() {
        request.set("content-length", length.to_string().as_bytes());
        request.remove("transfer-encoding");
    }
}
