//! A request that re-enters the chain after an internal redirect (`llm_gateway_shared::reentry`):
//! one admission and one settlement per logical request, however many passes it takes.
//!
//! The superseded pass (its `on_log` sees `response.code_details = internal_redirect`)
//! settles nothing: it stashes its admission — buckets taken, the budget reservation, the
//! cost (prompt estimate and output cap), the budget fallback it switched to — under the
//! logical request id. The re-entering pass (`x-llm-reentry`) takes it and skips admission:
//! no second RPM/TPM count, no second reservation; its body only gets the same edits (the
//! output cap, the fallback's model) and it settles once, in its own `on_log`, from
//! usage-accounting's record. A re-entering pass that finds no stash is admitted afresh (in
//! the Higress build its `RESERVE` under the same reservation key is answered as a replay,
//! not deducted twice).

/// What `on_log` does with a request's admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtLog {
    /// Settle it: refunds, reconcile (the pass is the last of its request).
    Settle,
    /// Hand it to the next pass unsettled (the pass was superseded).
    Carry,
}

/// `on_log`'s choice. Only an admission that completed is carried: a pass that was refused,
/// or is still waiting for a lease or a reservation, was never forwarded, so the redirect
/// cannot have come from its upstream; settling it gives back what it holds.
pub fn at_log(superseded: bool, admitted: bool, in_flight: bool) -> AtLog {
    if superseded && admitted && !in_flight {
        AtLog::Carry
    } else {
        AtLog::Settle
    }
}

/// Whether a re-entering pass writes the budget fallback of its first pass again: unless the
/// router already routes this pass within the group switched to. The reservation was priced
/// for that group; a pass routed back to the refused group could overspend the budget.
pub fn reapply_switch(switched_group: &str, routed_group: Option<&str>) -> bool {
    routed_group != Some(switched_group)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_superseded_admitted_pass_is_carried() {
        for superseded in [false, true] {
            for admitted in [false, true] {
                for in_flight in [false, true] {
                    let expected = if superseded && admitted && !in_flight {
                        AtLog::Carry
                    } else {
                        AtLog::Settle
                    };
                    assert_eq!(
                        at_log(superseded, admitted, in_flight),
                        expected,
                        "{superseded} {admitted} {in_flight}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_switch_is_written_again_unless_already_routed_there() {
        assert!(reapply_switch("cheap", None));
        assert!(reapply_switch("cheap", Some("smart")));
        assert!(!reapply_switch("cheap", Some("cheap")));
    }
}
