//! Spend per tenant / project / model group for a month, from records: what
//! `scripts/usage-report` prints (text or CSV), with the cache hit rate
//! (cached prompt tokens ÷ prompt tokens). Integer arithmetic throughout.
//!
//! Input lines may be a bare record (the Redis ledger's `record` field, or a JSON-lines file),
//! an Envoy access-log JSON line whose `usage` member holds the record as a string (the
//! `%FILTER_STATE(wasm.llm_usage:PLAIN)%` field), or a plugin log line containing
//! `usage_record: {…}`. Other lines are skipped and counted.

use crate::pricing::format_nano;
use crate::record::{Record, UsageSource};
use std::collections::BTreeMap;

/// A calendar month (UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Month {
    /// Year.
    pub year: i64,
    /// 1..=12.
    pub month: u32,
}

impl Month {
    /// `"2026-11"`.
    pub fn parse(text: &str) -> Result<Month, String> {
        let bad = || format!("month must be YYYY-MM, not {text:?}");
        let (year, month) = text.split_once('-').ok_or_else(bad)?;
        let year: i64 = year.parse().map_err(|_| bad())?;
        let month: u32 = month.parse().map_err(|_| bad())?;
        if !(1..=12).contains(&month) || !(1970..=9999).contains(&year) {
            return Err(bad());
        }
        Ok(Month { year, month })
    }

    /// The month holding a Unix millisecond.
    pub fn containing(ms: u64) -> Month {
        // Howard Hinnant's civil_from_days
        let z = i64::try_from(ms / 86_400_000).unwrap_or(0) + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + i64::from(month <= 2);
        Month {
            year,
            month: u32::try_from(month).unwrap_or(1),
        }
    }

    /// `[first ms, first ms of the next month)`, Unix milliseconds.
    pub fn range_ms(&self) -> (u64, u64) {
        let start = days_from_civil(self.year, self.month, 1);
        let (ny, nm) = if self.month == 12 {
            (self.year + 1, 1)
        } else {
            (self.year, self.month + 1)
        };
        let end = days_from_civil(ny, nm, 1);
        let ms = |days: i64| u64::try_from(days).unwrap_or(0) * 86_400_000;
        (ms(start), ms(end))
    }
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The record in one input line, if it holds one.
pub fn record_from_line(line: &str) -> Option<Record> {
    let line = line.trim();
    if let Some((_, json)) = line.split_once("usage_record: ") {
        return serde_json::from_str(json.trim()).ok();
    }
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    match value.get("usage") {
        Some(serde_json::Value::String(inner)) => serde_json::from_str(inner).ok(),
        _ => serde_json::from_value(value).ok(),
    }
}

/// One row: a tenant, project and model group in one currency.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Row {
    /// Tenant (`-` when absent).
    pub tenant: String,
    /// Project (`-`).
    pub project: String,
    /// Model group (`-`).
    pub model_group: String,
    /// Currency (`-` when unpriced).
    pub currency: String,
    /// Records.
    pub requests: u64,
    /// Of which estimated.
    pub estimated: u64,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Cached prompt tokens.
    pub cached_prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// Cost, nano-units.
    pub cost_nano: u64,
}

impl Row {
    /// Cached ÷ prompt, in tenths of a percent (`625` = 62.5 %); 0 without prompt tokens.
    pub fn cache_hit_permille(&self) -> u64 {
        if self.prompt_tokens == 0 {
            return 0;
        }
        let permille =
            u128::from(self.cached_prompt_tokens) * 1000 / u128::from(self.prompt_tokens);
        u64::try_from(permille).unwrap_or(u64::MAX)
    }
}

/// The rows of a report over `records` (only those of `month`, when given), sorted by
/// tenant, project, model group; a request id seen twice counts once (a ledger entry and a
/// log line of the same request, or a replayed ledger).
pub fn aggregate(records: impl IntoIterator<Item = Record>, month: Option<Month>) -> Vec<Row> {
    let range = month.map(|m| m.range_ms());
    let mut seen = std::collections::HashSet::new();
    let mut rows: BTreeMap<(String, String, String, String), Row> = BTreeMap::new();
    for record in records {
        if let Some((start, end)) = range {
            if record.ts_ms < start || record.ts_ms >= end {
                continue;
            }
        }
        if !record.request_id.is_empty() && !seen.insert(record.request_id.clone()) {
            continue;
        }
        let name = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        let key = (
            name(&record.tenant),
            name(&record.project),
            name(&record.model_group),
            name(&record.currency),
        );
        let row = rows.entry(key.clone()).or_insert_with(|| Row {
            tenant: key.0,
            project: key.1,
            model_group: key.2,
            currency: key.3,
            ..Row::default()
        });
        row.requests += 1;
        if record.usage_source == UsageSource::Estimated {
            row.estimated += 1;
        }
        let u = &record.usage;
        row.prompt_tokens = row.prompt_tokens.saturating_add(u.prompt_tokens);
        row.cached_prompt_tokens = row
            .cached_prompt_tokens
            .saturating_add(u.cached_prompt_tokens);
        row.completion_tokens = row.completion_tokens.saturating_add(u.completion_tokens);
        row.cost_nano = row.cost_nano.saturating_add(record.cost_nano.unwrap_or(0));
    }
    rows.into_values().collect()
}

fn percent(permille: u64) -> String {
    format!("{}.{}%", permille / 10, permille % 10)
}

const HEADER: [&str; 10] = [
    "tenant",
    "project",
    "model_group",
    "requests",
    "estimated",
    "prompt_tokens",
    "cached_prompt_tokens",
    "completion_tokens",
    "cache_hit_rate",
    "cost",
];

fn cells(row: &Row) -> [String; 10] {
    [
        row.tenant.clone(),
        row.project.clone(),
        row.model_group.clone(),
        row.requests.to_string(),
        row.estimated.to_string(),
        row.prompt_tokens.to_string(),
        row.cached_prompt_tokens.to_string(),
        row.completion_tokens.to_string(),
        percent(row.cache_hit_permille()),
        format!("{} {}", format_nano(row.cost_nano), row.currency),
    ]
}

/// An aligned text table, with a total line per currency.
pub fn render_text(rows: &[Row]) -> String {
    let mut table: Vec<[String; 10]> = vec![HEADER.map(str::to_owned)];
    table.extend(rows.iter().map(cells));
    let mut totals: BTreeMap<String, Row> = BTreeMap::new();
    for row in rows {
        let total = totals.entry(row.currency.clone()).or_insert_with(|| Row {
            tenant: "TOTAL".into(),
            project: String::new(),
            model_group: String::new(),
            currency: row.currency.clone(),
            ..Row::default()
        });
        total.requests += row.requests;
        total.estimated += row.estimated;
        total.prompt_tokens += row.prompt_tokens;
        total.cached_prompt_tokens += row.cached_prompt_tokens;
        total.completion_tokens += row.completion_tokens;
        total.cost_nano += row.cost_nano;
    }
    table.extend(totals.values().map(cells));
    let widths: Vec<usize> = (0..HEADER.len())
        .map(|c| {
            table
                .iter()
                .map(|r| r.get(c).map_or(0, String::len))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in &table {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(c, (cell, width))| {
                if c < 3 {
                    format!("{cell:<width$}")
                } else {
                    format!("{cell:>width$}")
                }
            })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// CSV (RFC 4180): the cost as a decimal and its currency in separate columns.
pub fn render_csv(rows: &[Row]) -> String {
    let quote = |s: &str| {
        if s.contains([',', '"', '\n', '\r']) {
            format!("\"{}\"", s.replace('"', "\"\""))
        } else {
            s.to_string()
        }
    };
    let mut out = String::from("tenant,project,model_group,requests,estimated,prompt_tokens,cached_prompt_tokens,completion_tokens,cache_hit_rate,cost,currency\n");
    for row in rows {
        let permille = row.cache_hit_permille();
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{}.{:03},{},{}\n",
            quote(&row.tenant),
            quote(&row.project),
            quote(&row.model_group),
            row.requests,
            row.estimated,
            row.prompt_tokens,
            row.cached_prompt_tokens,
            row.completion_tokens,
            permille / 1000,
            permille % 1000,
            format_nano(row.cost_nano),
            quote(&row.currency),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::UsageFields;

    fn record(
        id: &str,
        tenant: &str,
        project: &str,
        ts_ms: u64,
        prompt: u64,
        cached: u64,
        cost: u64,
    ) -> Record {
        Record {
            request_id: id.into(),
            ts_ms,
            consumer: None,
            tenant: Some(tenant.into()),
            key_id: None,
            tier: None,
            project: Some(project.into()),
            agent: None,
            run_id: None,
            model_group: Some("fast".into()),
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
                prompt_tokens: prompt,
                cached_prompt_tokens: cached,
                completion_tokens: 10,
                total_tokens: prompt + 10,
                ..UsageFields::default()
            },
            cost_nano: Some(cost),
            currency: Some("USD".into()),
            price_version: Some("v".into()),
            ttft_ms: None,
            duration_ms: 1,
        }
    }

    #[test]
    fn month_ranges() {
        let nov = Month::parse("2026-11").unwrap();
        assert_eq!(nov.range_ms().0, 1_793_491_200_000); // 2026-11-01T00:00:00Z
        assert_eq!(nov.range_ms().1, 1_796_083_200_000); // 2026-12-01
        let dec = Month::parse("2026-12").unwrap();
        assert_eq!(dec.range_ms().1, 1_798_761_600_000); // 2027-01-01
        assert_eq!(Month::parse("1970-01").unwrap().range_ms().0, 0);
        for (ms, month) in [
            (0, "1970-01"),
            (1_793_491_200_000 - 1, "2026-10"),
            (1_793_491_200_000, "2026-11"),
            (1_798_761_600_000 - 1, "2026-12"),
            (1_798_761_600_000, "2027-01"),
            (951_782_400_000, "2000-02"), // 2000-02-29
        ] {
            assert_eq!(Month::containing(ms), Month::parse(month).unwrap(), "{ms}");
        }
        for bad in ["2026", "2026-13", "x-01", "2026-1x"] {
            assert!(Month::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn aggregates_by_tenant_project_group_within_the_month() {
        let nov = Month::parse("2026-11").unwrap();
        let (start, end) = nov.range_ms();
        let records = vec![
            record("1", "acme", "search", start, 1000, 600, 243_600),
            record("2", "acme", "search", end - 1, 1000, 0, 400_000),
            record("2", "acme", "search", end - 1, 1000, 0, 400_000), // same request again
            record("3", "acme", "chat", start + 5, 100, 50, 1),
            record("4", "acme", "search", end, 1000, 0, 999), // next month
            record("5", "beta", "search", start - 1, 1000, 0, 999), // last month
        ];
        let rows = aggregate(records, Some(nov));
        assert_eq!(rows.len(), 2);
        let search = &rows[1];
        assert_eq!((search.project.as_str(), search.requests), ("search", 2));
        assert_eq!(search.prompt_tokens, 2000);
        assert_eq!(search.cost_nano, 643_600);
        assert_eq!(search.cache_hit_permille(), 300);
        let text = render_text(&rows);
        assert!(text.contains("30.0%"), "{text}");
        assert!(text.contains("0.0006436 USD"), "{text}");
        assert!(text.lines().last().unwrap().starts_with("TOTAL"), "{text}");
        let csv = render_csv(&rows);
        assert_eq!(
            csv.lines().nth(2).unwrap(),
            "acme,search,fast,2,0,2000,600,20,0.300,0.0006436,USD"
        );
    }

    #[test]
    fn reads_every_line_shape() {
        let r = record("x", "acme", "p", 1, 10, 0, 5);
        let json = r.to_json();
        assert_eq!(record_from_line(&json), Some(r.clone()));
        let access = serde_json::json!({"status": 200, "usage": json}).to_string();
        assert_eq!(record_from_line(&access), Some(r.clone()));
        let log =
            format!("[2026-11-30][info][wasm] wasm log usage-accounting: usage_record: {json}");
        assert_eq!(record_from_line(&log), Some(r));
        assert_eq!(record_from_line(r#"{"status":200,"usage":"-"}"#), None);
        assert_eq!(record_from_line("garbage"), None);
    }

    #[test]
    fn csv_quotes_odd_names() {
        let mut r = record("1", "a,b", "q\"x", 0, 0, 0, 0);
        r.currency = None;
        let csv = render_csv(&aggregate([r], None));
        assert!(
            csv.contains("\"a,b\",\"q\"\"x\",fast,1,0,0,0,10,0.000,0,-"),
            "{csv}"
        );
    }
}
