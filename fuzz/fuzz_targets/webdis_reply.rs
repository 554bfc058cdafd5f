//! webdis answers (`shared::webdis::reply`, the HTTP Redis transport): any `:status` and body
//! a webdis, or whatever answers in its place, may send; and the requests commands become.
//!
//! Input: `status selector, body bytes`. Checked:
//! - no input panics;
//! - a 200 gives RESP that `shared::resp` decodes whole, or `Malformed`; a non-200 is never a
//!   reply;
//! - the token-ratelimit script readers take whatever comes out;
//! - a request body (the same bytes as arguments) is capped and never contains a raw `/`
//!   inside an argument, a `+`, a `?` or a control byte other than newline and tab.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llm_gateway_fuzz::Input;
use llm_gateway_shared::resp::{decode, Limits, RespError};
use llm_gateway_shared::webdis::{reply, request_body, WebdisError, MAX_REQUEST_BODY};
use token_ratelimit::scripts;

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let status = match input.byte() % 5 {
        0 => None,
        1 => Some("403"),
        2 => Some("503"),
        3 => Some("2x0"),
        _ => Some("200"),
    };
    let body = input.rest().to_vec();
    match reply(status, body.clone()) {
        Ok(resp) => {
            assert_eq!(status, Some("200"));
            // well-formed RESP: it decodes, unless it is past the decoder's size limits
            if let Err(err) = decode(&resp, &Limits::default()) {
                assert!(
                    !matches!(
                        err,
                        RespError::Incomplete
                            | RespError::UnknownType(_)
                            | RespError::BadNumber(_)
                            | RespError::MissingCrlf(_)
                    ),
                    "{err:?}"
                );
            }
            let _ = scripts::decode_reserve(&resp, 2);
            let _ = scripts::decode_lease(&resp);
            let _ = scripts::decode_reconcile(&resp, 1);
        }
        Err(WebdisError::Malformed) => assert_eq!(status, Some("200")),
        Err(_) => {}
    }
    // the body's bytes as the arguments of a command, split at each 0xff
    let args: Vec<&[u8]> = body.split(|b| *b == 0xff).collect();
    if let Ok(request) = request_body(&args) {
        assert!(request.len() <= MAX_REQUEST_BODY);
        assert!(request.ends_with(b".json"));
        let slashes = request.iter().filter(|b| **b == b'/').count();
        assert_eq!(slashes, args.len().saturating_sub(1));
        assert!(!request
            .iter()
            .any(|b| matches!(b, b'+' | b'?')
                || (b.is_ascii_control() && !matches!(b, b'\n' | b'\t'))));
    }
});
