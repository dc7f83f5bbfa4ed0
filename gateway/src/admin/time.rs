//! UTC timestamps for the dashboard: milliseconds since the Unix epoch to
//! `YYYY-MM-DD HH:MM:SS` and back from the `YYYY-MM-DDTHH:MM` of an HTML `datetime-local`
//! input. Hand-written (Howard Hinnant's days-from-civil algorithm) because the gateway has
//! no date crate and needs nothing else of one. Everything is UTC; the pages say so.

/// `2026-11-30 09:27:41` for `time_ms` (UTC).
pub fn format_ms(time_ms: u64) -> String {
    let secs = time_ms / 1000;
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// The `datetime-local` value (`YYYY-MM-DDTHH:MM`) for `time_ms`, to refill a filter form.
pub fn format_input(time_ms: u64) -> String {
    let mut s = format_ms(time_ms);
    s.truncate(16);
    s.replace(' ', "T")
}

/// Parses `YYYY-MM-DDTHH:MM` (seconds optional) as UTC milliseconds; `None` if malformed.
pub fn parse_input(value: &str) -> Option<u64> {
    let (date, clock) = value.split_once('T')?;
    let mut date_parts = date.splitn(3, '-').map(str::parse::<u32>);
    let (y, m, d) = (date_parts.next()?.ok()?, date_parts.next()?.ok()?, date_parts.next()?.ok()?);
    let mut clock_parts = clock.splitn(3, ':').map(str::parse::<u32>);
    let (hh, mm) = (clock_parts.next()?.ok()?, clock_parts.next()?.ok()?);
    let ss = clock_parts.next().transpose().ok()?.unwrap_or(0);
    let valid =
        (1970..=9999).contains(&y) && (1..=12).contains(&m) && (1..=31).contains(&d) && hh < 24 && mm < 60 && ss < 60;
    if !valid {
        return None;
    }
    let days = days_from_civil(y as i64, m, d);
    if civil_from_days(days) != (y as i64, m, d) {
        return None; // 31 February and friends
    }
    let secs = days as u64 * 86_400 + u64::from(hh) * 3600 + u64::from(mm) * 60 + u64::from(ss);
    Some(secs * 1000)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (i64::from(m) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { yoe + era * 400 + 1 } else { yoe + era * 400 }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(format_ms(0), "1970-01-01 00:00:00");
        assert_eq!(format_ms(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(format_ms(1_796_031_261_999), "2026-11-30 09:34:21");
        assert_eq!(format_input(1_796_031_261_999), "2026-11-30T09:34");
    }

    #[test]
    fn parses_what_it_formats_and_refuses_nonsense() {
        for ms in [0, 951_782_400_000, 1_796_031_240_000, 4_102_444_800_000] {
            assert_eq!(parse_input(&format_input(ms)), Some(ms));
        }
        assert_eq!(parse_input("2026-11-30T09:34:21"), Some(1_796_031_261_000));
        for bad in [
            "",
            "2026-11-30",
            "2026-02-30T00:00",
            "2026-13-01T00:00",
            "2026-11-30T24:00",
            "x-1-1T1:1",
            "1969-12-31T23:59",
        ] {
            assert_eq!(parse_input(bad), None, "{bad}");
        }
    }
}
