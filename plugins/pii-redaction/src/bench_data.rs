//! The prompts the redaction figures are measured on, shared by `cargo bench -p pii-redaction`
//! and the harness cost workloads (`llm_gateway_tests::workloads`), so both measure the same
//! input. Native only; not part of the plugin.

/// One paragraph of neutral business prose (no personal data).
pub const PARAGRAPH: &str = "The quarterly review covers onboarding, billing disputes and the \
    migration plan for the reporting service. Please keep the tone neutral, summarise the open \
    questions, and list the owners for each follow-up item so the team can plan next week. ";

/// Prose of about `bytes` bytes; with `with_pii` an e-mail, a phone, an ID, a card and an IP
/// address after every three paragraphs.
pub fn prose(bytes: usize, with_pii: bool) -> String {
    let mut text = String::with_capacity(bytes + 512);
    let mut i = 0;
    while text.len() < bytes {
        text.push_str(PARAGRAPH);
        text.push_str(PARAGRAPH);
        text.push_str(PARAGRAPH);
        if with_pii {
            text.push_str(&format!(
                "Contact user{i}@example.com or 1380013{:04}, ID 11010519491231002X, card \
                 4111 1111 1111 1111, host 10.0.{}.{}. ",
                i % 10_000,
                i % 250,
                (i * 7) % 250
            ));
        }
        i += 1;
    }
    text
}
