//! What each provider refuses in a request body, with its own words: the flavored mocks check
//! a body here before answering it (the `Any` flavor does not).

mod anthropic;
mod fields;
mod openai;

use serde_json::Value;

use crate::error::ApiError;
use crate::flavor::{Flavor, Route};

/// Checks `req` (a JSON object) as the flavor's provider would for `route`.
pub(crate) fn check(flavor: Flavor, route: &Route, req: &Value) -> Result<(), ApiError> {
    if flavor == Flavor::Any {
        return Ok(());
    }
    match route {
        Route::Chat => openai::check_chat(req, true),
        Route::AzureChat(_) => openai::check_chat(req, false),
        Route::Embeddings => openai::check_embeddings(req, true),
        Route::AzureEmbeddings(_) => openai::check_embeddings(req, false),
        Route::Messages => anthropic::check(req, anthropic::Endpoint::Messages),
        Route::CountTokens => anthropic::check(req, anthropic::Endpoint::CountTokens),
        Route::Responses | Route::Health => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn any_checks_nothing() {
        let body = json!({"bogus": true});
        for route in [Route::Chat, Route::Messages, Route::Embeddings] {
            assert!(check(Flavor::Any, &route, &body).is_ok());
        }
        assert!(check(Flavor::Openai, &Route::Chat, &body).is_err());
        assert!(check(Flavor::Anthropic, &Route::Messages, &body).is_err());
    }
}
