//! RESP2 replies as Higress hands them over (`shared::resp`), and token-ratelimit's readers of
//! its Lua scripts' replies on top.
//!
//! Input: `limits selector, levels, reply bytes`. Checked:
//! - decoding never panics and takes no more than the input;
//! - `decode` is `decode_prefix` that used every byte;
//! - a decoded reply, encoded again, decodes to the same reply, within the same limits;
//! - the script readers take any reply (an error value, not a panic).
#![no_main]

use libfuzzer_sys::fuzz_target;
use llm_gateway_fuzz::{encode_reply, Input};
use llm_gateway_shared::resp::{decode, decode_prefix, Limits, RespError};
use token_ratelimit::scripts;

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let limits = match input.byte() % 3 {
        0 => Limits::default(),
        1 => Limits {
            max_depth: 2,
            max_elements: 3,
            max_bulk: 8,
        },
        _ => Limits {
            max_depth: 0,
            max_elements: 0,
            max_bulk: 0,
        },
    };
    let levels = usize::from(input.byte() % 5);
    let reply = input.rest();

    let prefix = decode_prefix(reply, &limits);
    let whole = decode(reply, &limits);
    match &prefix {
        Ok((decoded, used)) => {
            assert!(*used <= reply.len());
            if *used == reply.len() {
                assert_eq!(whole.as_ref(), Ok(decoded));
            } else {
                assert_eq!(whole, Err(RespError::TrailingBytes(*used)));
            }
            let _ = (
                decoded.integer(),
                decoded.bytes(),
                decoded.is_null(),
                decoded.error(),
            );
            let mut again = Vec::new();
            encode_reply(decoded, &mut again);
            assert_eq!(
                decode(&again, &limits).as_ref(),
                Ok(decoded),
                "encode/decode round trip"
            );
        }
        Err(e) => {
            assert_eq!(whole.as_ref().err(), Some(e));
            let _ = e.to_string();
        }
    }

    let _ = scripts::decode_lease(reply);
    let _ = scripts::decode_give_back(reply);
    let _ = scripts::decode_reserve(reply, levels);
    let _ = scripts::decode_reconcile(reply, levels);
    let _ = scripts::decode_charge(reply);
    let _ = scripts::decode_peek(reply, levels);
});
