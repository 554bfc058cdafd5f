//! `scripts/usage-report --html`: the month's report as one self-contained HTML file — the
//! totals, an inline SVG bar chart of spend per day and one of spend per model group (one pair
//! per currency), and the table of `usage_accounting::report` (tenant, project, model group).
//! No script, no external style sheet, font or image: it opens from disk in any browser.
//!
//! The figures are the text report's: [`render_html`] aggregates with
//! `usage_accounting::report::aggregate` (same month filter, a request id counted once), and
//! the per-day and per-group bars are sums of the same records.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write;
use usage_accounting::pricing::format_nano;
use usage_accounting::record::Record;
use usage_accounting::report::{aggregate, Month, Row};

const MS_PER_DAY: u64 = 86_400_000;

/// `YYYY-MM-DD` (UTC) of a Unix time in ms.
pub fn day_of(ms: u64) -> String {
    // days since 1970-01-01 to a civil date (proleptic Gregorian), in 400-year eras
    let days = i64::try_from(ms / MS_PER_DAY).unwrap_or(i64::MAX / 2) + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

/// Text safe inside HTML and SVG elements and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

/// Spend per key (a day, a model group) of one currency.
type Series = BTreeMap<String, u64>;

/// A horizontal bar chart: one bar per entry, its label on the left and its value on the right.
fn bar_chart(title: &str, series: &Series, currency: &str) -> String {
    let max = series.values().copied().max().unwrap_or(0).max(1);
    let (label_w, bar_w, value_w, bar_h) = (150u64, 560u64, 170u64, 22u64);
    let height = bar_h * series.len() as u64 + 10;
    let width = label_w + bar_w + value_w;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" role=\"img\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" aria-label=\"{}\">\n",
        escape(title)
    );
    for (i, (key, nano)) in series.iter().enumerate() {
        let y = i as u64 * bar_h + 5;
        let w = (u128::from(*nano) * u128::from(bar_w) / u128::from(max)) as u64;
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\" class=\"label\">{}</text>\
             <rect x=\"{label_w}\" y=\"{y}\" width=\"{}\" height=\"{}\" class=\"bar\"><title>{} {} {}</title></rect>\
             <text x=\"{}\" y=\"{}\" class=\"value\">{} {}</text>",
            label_w - 8,
            y + 15,
            escape(key),
            w.max(1),
            bar_h - 6,
            escape(key),
            format_nano(*nano),
            escape(currency),
            label_w + w.max(1) + 6,
            y + 15,
            format_nano(*nano),
            escape(currency),
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// The records of `month` (all when `None`), each request id once: what `aggregate` counts.
fn counted(records: Vec<Record>, month: Option<Month>) -> Vec<Record> {
    let range = month.map(|m| m.range_ms());
    let mut seen = HashSet::new();
    records
        .into_iter()
        .filter(|r| range.is_none_or(|(start, end)| r.ts_ms >= start && r.ts_ms < end))
        .filter(|r| r.request_id.is_empty() || seen.insert(r.request_id.clone()))
        .collect()
}

/// The report of `records` for `month` as one HTML document.
pub fn render_html(records: Vec<Record>, month: Option<Month>) -> String {
    let records = counted(records, month);
    let rows = aggregate(records.clone(), None);
    let currency = |r: &Record| r.currency.clone().unwrap_or_else(|| "-".into());
    // per currency: spend per day, per model group
    let mut days: BTreeMap<String, Series> = BTreeMap::new();
    let mut groups: BTreeMap<String, Series> = BTreeMap::new();
    for record in &records {
        let cost = record.cost_nano.unwrap_or(0);
        *days
            .entry(currency(record))
            .or_default()
            .entry(day_of(record.ts_ms))
            .or_default() += cost;
        *groups
            .entry(currency(record))
            .or_default()
            .entry(record.model_group.clone().unwrap_or_else(|| "-".into()))
            .or_default() += cost;
    }
    let period = month.map_or("all records".to_string(), |m| {
        format!("{:04}-{:02}", m.year, m.month)
    });
    let mut html = format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>LLM gateway usage, {period}</title>\n<style>\n\
         body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}\n\
         table {{ border-collapse: collapse; }}\n\
         th, td {{ border: 1px solid #ccc; padding: 4px 8px; }}\n\
         td.n {{ text-align: right; font-variant-numeric: tabular-nums; }}\n\
         tr.total td {{ font-weight: bold; }}\n\
         svg .bar {{ fill: #3b82f6; }} svg .label, svg .value {{ font-size: 12px; fill: #222; }}\n\
         </style>\n</head>\n<body>\n<h1>LLM gateway usage, {period}</h1>\n"
    );
    // totals per currency
    let mut totals: BTreeMap<String, Row> = BTreeMap::new();
    for row in &rows {
        let total = totals.entry(row.currency.clone()).or_default();
        total.requests += row.requests;
        total.prompt_tokens += row.prompt_tokens;
        total.completion_tokens += row.completion_tokens;
        total.cost_nano += row.cost_nano;
    }
    html.push_str("<ul class=\"totals\">\n");
    for (currency, total) in &totals {
        let _ = writeln!(
            html,
            "<li>Total: <span class=\"total-cost\">{} {}</span>, {} requests, {} prompt and {} completion tokens</li>",
            format_nano(total.cost_nano),
            escape(currency),
            total.requests,
            total.prompt_tokens,
            total.completion_tokens
        );
    }
    if totals.is_empty() {
        html.push_str("<li>No usage records in this period.</li>\n");
    }
    html.push_str("</ul>\n");
    for (currency, series) in &days {
        let _ = writeln!(html, "<h2>Spend per day ({})</h2>", escape(currency));
        html.push_str(&bar_chart("Spend per day", series, currency));
    }
    for (currency, series) in &groups {
        let _ = writeln!(
            html,
            "<h2>Spend per model group ({})</h2>",
            escape(currency)
        );
        html.push_str(&bar_chart("Spend per model group", series, currency));
    }
    html.push_str(
        "<h2>By tenant, project and model group</h2>\n<table>\n<thead><tr><th>tenant</th><th>project</th><th>model group</th>\
         <th>requests</th><th>estimated</th><th>prompt tokens</th><th>cached prompt tokens</th><th>completion tokens</th>\
         <th>cost</th></tr></thead>\n<tbody>\n",
    );
    for row in &rows {
        let _ = writeln!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{} {}</td></tr>",
            escape(&row.tenant),
            escape(&row.project),
            escape(&row.model_group),
            row.requests,
            row.estimated,
            row.prompt_tokens,
            row.cached_prompt_tokens,
            row.completion_tokens,
            format_nano(row.cost_nano),
            escape(&row.currency)
        );
    }
    for (currency, total) in &totals {
        let _ = writeln!(
            html,
            "<tr class=\"total\"><td>TOTAL</td><td></td><td></td><td class=\"n\">{}</td><td></td><td class=\"n\">{}</td>\
             <td></td><td class=\"n\">{}</td><td class=\"n\">{} {}</td></tr>",
            total.requests,
            total.prompt_tokens,
            total.completion_tokens,
            format_nano(total.cost_nano),
            escape(currency)
        );
    }
    html.push_str("</tbody>\n</table>\n</body>\n</html>\n");
    html
}

#[cfg(test)]
mod tests {
    use super::*;
    use usage_accounting::record::{UsageFields, UsageSource};
    use usage_accounting::report::render_text;

    fn record(id: &str, tenant: &str, group: &str, ts_ms: u64, cost: u64) -> Record {
        Record {
            request_id: id.into(),
            ts_ms,
            consumer: None,
            tenant: Some(tenant.into()),
            key_id: None,
            tier: None,
            project: None,
            agent: None,
            run_id: None,
            model_group: Some(group.into()),
            deployment: None,
            model: None,
            api: "chat.completions".into(),
            provider_api: Some("chat.completions".into()),
            stream: false,
            status: 200,
            complete: true,
            attempts: vec![],
            usage_source: UsageSource::Upstream,
            usage: UsageFields {
                prompt_tokens: 10,
                completion_tokens: 5,
                ..UsageFields::default()
            },
            cost_nano: Some(cost),
            currency: Some("USD".into()),
            price_version: None,
            ttft_ms: None,
            duration_ms: 1,
        }
    }

    // 2026-12-01T00:00:00Z
    const DEC_1: u64 = 1_796_083_200_000;

    fn records() -> Vec<Record> {
        vec![
            record("a", "acme", "fast", DEC_1 + 1_000, 1_500_000_000),
            record("b", "acme", "smart", DEC_1 + MS_PER_DAY + 5, 250_000_000),
            record(
                "c",
                "<b>globex</b>",
                "fast",
                DEC_1 + MS_PER_DAY + 9,
                1_000_000,
            ),
            // the same request again (a replayed ledger entry): counted once
            record(
                "c",
                "<b>globex</b>",
                "fast",
                DEC_1 + MS_PER_DAY + 9,
                1_000_000,
            ),
            // November: outside the month
            record("d", "acme", "fast", DEC_1 - 1, 7_000_000_000),
        ]
    }

    #[test]
    fn days_are_civil_dates_in_utc() {
        assert_eq!(day_of(0), "1970-01-01");
        assert_eq!(day_of(DEC_1), "2026-12-01");
        assert_eq!(day_of(DEC_1 - 1), "2026-11-30");
        // 2024-02-29 and the day after
        assert_eq!(day_of(1_709_164_800_000), "2024-02-29");
        assert_eq!(day_of(1_709_164_800_000 + MS_PER_DAY), "2024-03-01");
    }

    #[test]
    fn the_html_report_has_its_charts_and_the_text_reports_totals() {
        let month = Month::parse("2026-12").unwrap();
        let html = render_html(records(), Some(month));
        assert!(html.starts_with("<!DOCTYPE html>\n<html"));
        assert!(html.trim_end().ends_with("</html>"));
        // self-contained: no script, no external resource
        for absent in ["<script", "src=", "href=", "@import", "url("] {
            assert!(!html.contains(absent), "{absent}");
        }
        // balanced elements
        for tag in [
            "html", "head", "body", "svg", "table", "tbody", "tr", "td", "h2", "ul",
        ] {
            let open = html.matches(&format!("<{tag}>")).count()
                + html.matches(&format!("<{tag} ")).count();
            assert_eq!(open, html.matches(&format!("</{tag}>")).count(), "<{tag}>");
        }
        // two charts: per day (2 days of December) and per model group (fast, smart)
        assert_eq!(html.matches("<svg ").count(), 2);
        let day_chart =
            &html[html.find("Spend per day").unwrap()..html.find("Spend per model group").unwrap()];
        assert_eq!(day_chart.matches("<rect ").count(), 2);
        assert!(
            day_chart.contains("2026-12-01 1.5 USD") && day_chart.contains("2026-12-02 0.251 USD")
        );
        let group_chart =
            &html[html.find("Spend per model group").unwrap()..html.find("<table>").unwrap()];
        assert!(group_chart.contains("fast 1.501 USD") && group_chart.contains("smart 0.25 USD"));
        // client-supplied names are escaped
        assert!(html.contains("&lt;b&gt;globex&lt;/b&gt;") && !html.contains("<b>globex"));
        // the totals are the text report's TOTAL line: 3 requests, 30 + 15 tokens, 1.751 USD
        let text = render_text(&aggregate(records(), Some(month)));
        let total = text.lines().find(|l| l.starts_with("TOTAL")).unwrap();
        let fields: Vec<&str> = total.split_whitespace().collect();
        assert_eq!(
            fields,
            ["TOTAL", "3", "0", "30", "0", "15", "0.0%", "1.751", "USD"]
        );
        assert!(html.contains(
            "<span class=\"total-cost\">1.751 USD</span>, 3 requests, 30 prompt and 15 completion tokens"
        ));
        assert!(html.contains(
            "<tr class=\"total\"><td>TOTAL</td><td></td><td></td><td class=\"n\">3</td>"
        ));
    }

    #[test]
    fn an_empty_period_says_so() {
        let html = render_html(Vec::new(), Some(Month::parse("2026-01").unwrap()));
        assert!(html.contains("No usage records in this period."));
        assert!(!html.contains("<svg"));
    }
}
