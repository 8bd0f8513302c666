//! Durations in flags: `500ms`, `5s`, `2m`, `1h`, or a plain number of seconds.

use std::time::Duration;

/// Parses a flag duration: an integer with unit `ms`, `s`, `m` or `h`, or a plain number of
/// seconds. For use as a clap `value_parser`.
pub fn parse_duration(value: &str) -> Result<Duration, String> {
    let value = value.trim();
    let split = value
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{value:?} is not a duration like 500ms, 5s, 2m or 1h"))?;
    let millis = match unit {
        "ms" => Some(number),
        "" | "s" => number.checked_mul(1_000),
        "m" => number.checked_mul(60_000),
        "h" => number.checked_mul(3_600_000),
        other => {
            return Err(format!(
                "unknown unit {other:?} in {value:?} (use ms, s, m or h)"
            ));
        }
    };
    millis
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{value:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_every_unit() {
        let table = [
            ("500ms", Duration::from_millis(500)),
            ("5s", Duration::from_secs(5)),
            ("7", Duration::from_secs(7)),
            ("2m", Duration::from_secs(120)),
            ("1h", Duration::from_secs(3600)),
            (" 3s ", Duration::from_secs(3)),
        ];
        for (text, want) in table {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn bad_durations_say_what_is_expected() {
        for text in ["", "s", "5d", "-1s", "1.5s", "99999999999999999999h"] {
            let err = parse_duration(text).expect_err(text);
            assert!(!err.is_empty(), "{text}");
        }
        assert_eq!(
            parse_duration("5d").expect_err("unknown unit"),
            "unknown unit \"d\" in \"5d\" (use ms, s, m or h)"
        );
    }
}
