//! The Python functions Hugging Face chat templates call: `raise_exception(message)`,
//! `tojson` (Python's `json.dumps(..., ensure_ascii=False)`) and `strftime_now(format)`.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::ErrorKind;

pub(super) fn raise_exception(message: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

/// `tojson(indent=None)`: Python's `json.dumps(value, ensure_ascii=False, indent=indent)`.
pub(super) fn tojson(
    value: &Value,
    indent: Option<usize>,
    kwargs: Kwargs,
) -> std::result::Result<Value, minijinja::Error> {
    let indent = kwargs.get::<Option<usize>>("indent")?.or(indent);
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(&mut out, value, indent, 0)?;
    Ok(Value::from_safe_string(out))
}

fn write_json(
    out: &mut String,
    v: &Value,
    indent: Option<usize>,
    depth: usize,
) -> std::result::Result<(), minijinja::Error> {
    let json_err = |e: serde_json::Error| minijinja::Error::new(ErrorKind::InvalidOperation, e.to_string());
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => match v.as_i64() {
            Some(i) => out.push_str(&i.to_string()),
            None => out.push_str(&serde_json::to_string(&f64::try_from(v.clone())?).map_err(json_err)?),
        },
        ValueKind::String => out.push_str(&serde_json::to_string(v.as_str().unwrap_or("")).map_err(json_err)?),
        ValueKind::Seq | ValueKind::Iterable | ValueKind::Map => {
            let is_map = v.kind() == ValueKind::Map;
            let (open, close) = if is_map { ('{', '}') } else { ('[', ']') };
            let items: Vec<Value> = v.try_iter()?.collect();
            out.push(open);
            for (i, item) in items.iter().enumerate() {
                out.push_str(match (i, indent) {
                    (0, _) => "",
                    (_, None) => ", ",
                    (_, Some(_)) => ",",
                });
                if let Some(width) = indent {
                    out.push('\n');
                    out.push_str(&" ".repeat(width * (depth + 1)));
                }
                if is_map {
                    write_json(out, &Value::from(item.to_string()), None, 0)?;
                    out.push_str(": ");
                    write_json(out, &v.get_item(item)?, indent, depth + 1)?;
                } else {
                    write_json(out, item, indent, depth + 1)?;
                }
            }
            if let (Some(width), false) = (indent, items.is_empty()) {
                out.push('\n');
                out.push_str(&" ".repeat(width * depth));
            }
            out.push(close);
        }
        _ => {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson cannot serialize a {} value", v.kind()),
            ))
        }
    }
    Ok(())
}

/// `strftime_now(format)`: the current UTC time; supports `%Y %y %m %d %e %B %b %A %a
/// %H %M %S %j %%` (what chat templates use for "today's date").
pub(super) fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    strftime(&format, secs)
}

fn strftime(format: &str, unix_secs: u64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = ["Thursday", "Friday", "Saturday", "Sunday", "Monday", "Tuesday", "Wednesday"];
    let days = unix_secs / 86_400;
    let secs = unix_secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    let month_name = MONTHS.get(month as usize - 1).copied().unwrap_or("");
    let day_name = DAYS.get((days % 7) as usize).copied().unwrap_or("");
    let day_of_year = days - days_from_civil(year, 1, 1) + 1;
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let piece = match chars.next() {
            Some('Y') => year.to_string(),
            Some('y') => format!("{:02}", year % 100),
            Some('m') => format!("{month:02}"),
            Some('d') => format!("{day:02}"),
            Some('e') => format!("{day:>2}"),
            Some('B') => month_name.to_owned(),
            Some('b') => month_name.get(..3).unwrap_or("").to_owned(),
            Some('A') => day_name.to_owned(),
            Some('a') => day_name.get(..3).unwrap_or("").to_owned(),
            Some('H') => format!("{:02}", secs / 3600),
            Some('M') => format!("{:02}", secs / 60 % 60),
            Some('S') => format!("{:02}", secs % 60),
            Some('j') => format!("{day_of_year:03}"),
            Some('%') => "%".to_owned(),
            Some(other) => format!("%{other}"),
            None => "%".to_owned(),
        };
        out.push_str(&piece);
    }
    out
}

/// Days since 1970-01-01 to (year, month 1-12, day 1-31), proleptic Gregorian.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    // Howard Hinnant's algorithm, shifted so March is month 0 and the era starts in 0000.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// The inverse of [`civil_from_days`] (for years from 1970).
fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y / 400;
    let yoe = y % 400;
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era * 146_097 + doe).saturating_sub(719_468)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::ChatTemplate;

    #[test]
    fn tojson_formats_like_python() {
        let t = ChatTemplate::new("{{ tools | tojson }}|{{ tools | tojson(indent=2) }}|{{ bos_token }}", "<s>", "")
            .unwrap();
        let tools = serde_json::json!([{"a": 1, "b": [true, null, 0.5, "é<\"x\">"], "c": {}}]);
        let got = t.render(&[], Some(&tools), false).unwrap();
        let compact = r#"[{"a": 1, "b": [true, null, 0.5, "é<\"x\">"], "c": {}}]"#;
        let pretty = "[\n  {\n    \"a\": 1,\n    \"b\": [\n      true,\n      null,\n      0.5,\n      \
                      \"é<\\\"x\\\">\"\n    ],\n    \"c\": {}\n  }\n]";
        assert_eq!(got, format!("{compact}|{pretty}|<s>"));
        let none = ChatTemplate::new("{{ tools is none }}", "", "").unwrap();
        assert_eq!(none.render(&[], None, false).unwrap(), "True"); // as Jinja2 prints it
    }

    #[test]
    fn strftime_formats_dates() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(strftime("%d %b %Y", t), "29 Feb 2024");
        assert_eq!(strftime("%A %B %e, %y %H:%M:%S %j %%", t), "Thursday February 29, 24 13:05:09 060 %");
        assert_eq!(strftime("%Y-%m-%d %a", 0), "1970-01-01 Thu");
        assert!(!strftime_now("%Y".into()).is_empty());
    }
}
