//! Kubernetes resource quantities parsed to integer milli-units.
//!
//! Grammar (as `k8s.io/apimachinery` `resource.Quantity`):
//! `[+-]` number (`12`, `1.5`, `1.`, `.5`) followed by at most one suffix: binary
//! `Ki Mi Gi Ti Pi Ei`, decimal `m k M G T P E` or none, or an exponent `e<int>` /
//! `E<int>`. The value is converted to milli-units and rounded up (away from zero)
//! like `Quantity.MilliValue`, so `"1.5m"` is 2 milli-units.

use std::fmt;

/// Why a quantity string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("empty quantity")]
    Empty,
    #[error("quantity {input:?}: expected a number")]
    NoDigits { input: String },
    #[error("quantity {input:?}: unknown suffix {suffix:?}")]
    UnknownSuffix { input: String, suffix: String },
    #[error("quantity {input:?}: invalid exponent")]
    BadExponent { input: String },
    #[error("quantity {input:?}: out of range for 64-bit milli-units")]
    OutOfRange { input: String },
}

/// Multiplier carried by a suffix: `base^power`.
#[derive(Clone, Copy)]
enum Scale {
    /// 2^(10·n), the binary SI suffixes.
    Binary(u32),
    /// 10^n, decimal SI suffixes and exponents.
    Decimal(i64),
}

fn suffix_scale(suffix: &str) -> Option<Scale> {
    Some(match suffix {
        "" => Scale::Decimal(0),
        "m" => Scale::Decimal(-3),
        "k" => Scale::Decimal(3),
        "M" => Scale::Decimal(6),
        "G" => Scale::Decimal(9),
        "T" => Scale::Decimal(12),
        "P" => Scale::Decimal(15),
        "E" => Scale::Decimal(18),
        "Ki" => Scale::Binary(1),
        "Mi" => Scale::Binary(2),
        "Gi" => Scale::Binary(3),
        "Ti" => Scale::Binary(4),
        "Pi" => Scale::Binary(5),
        "Ei" => Scale::Binary(6),
        _ => return None,
    })
}

/// Parses a Kubernetes quantity to milli-units (`"1"` → 1000, `"250m"` → 250,
/// `"1Ki"` → 1_024_000).
pub fn parse_quantity(input: &str) -> Result<i64, QuantityError> {
    if input.is_empty() {
        return Err(QuantityError::Empty);
    }
    let err_range = || QuantityError::OutOfRange {
        input: input.to_owned(),
    };
    let bytes = input.as_bytes();
    let mut i = 0;
    let negative = match bytes[0] {
        b'-' => {
            i = 1;
            true
        }
        b'+' => {
            i = 1;
            false
        }
        _ => false,
    };

    // The number is kept as `mantissa × 10^exp10`. Digits beyond u128
    // precision are dropped (shifting exp10 for integer digits) and only leave
    // a sticky bit for the round-up, so arbitrarily long inputs still parse.
    let mut mantissa: u128 = 0;
    let mut exp10: i64 = 0;
    let mut digits = 0usize;
    let mut dropped_nonzero = false;
    let mut seen_dot = false;
    while i < bytes.len() {
        match bytes[i] {
            b'0'..=b'9' => {
                digits += 1;
                let d = u128::from(bytes[i] - b'0');
                match mantissa.checked_mul(10).and_then(|m| m.checked_add(d)) {
                    Some(m) => {
                        mantissa = m;
                        if seen_dot {
                            exp10 -= 1;
                        }
                    }
                    None => {
                        dropped_nonzero |= d != 0;
                        if !seen_dot {
                            exp10 += 1;
                        }
                    }
                }
            }
            b'.' if !seen_dot => seen_dot = true,
            _ => break,
        }
        i += 1;
    }
    if digits == 0 {
        return Err(QuantityError::NoDigits {
            input: input.to_owned(),
        });
    }

    let rest = &input[i..];
    let scale = match suffix_scale(rest) {
        Some(scale) => scale,
        None => {
            // Not a suffix: the only other legal tail is an exponent `e<int>`/`E<int>`.
            let Some(exp) = rest.strip_prefix(['e', 'E']) else {
                return Err(QuantityError::UnknownSuffix {
                    input: input.to_owned(),
                    suffix: rest.to_owned(),
                });
            };
            let body = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            if body.is_empty() || !body.bytes().all(|b| b.is_ascii_digit()) {
                return Err(QuantityError::BadExponent {
                    input: input.to_owned(),
                });
            }
            match exp.parse::<i64>() {
                Ok(e) => Scale::Decimal(e),
                // Absurdly long exponents: only the sign matters.
                Err(_) if mantissa == 0 && !dropped_nonzero => return Ok(0),
                Err(_) if exp.starts_with('-') => return Ok(if negative { -1 } else { 1 }),
                Err(_) => return Err(err_range()),
            }
        }
    };

    if mantissa == 0 && !dropped_nonzero {
        return Ok(0);
    }
    let magnitude =
        scale_to_milli(mantissa, exp10, dropped_nonzero, scale).ok_or_else(err_range)?;
    let magnitude = i128::try_from(magnitude).map_err(|_| err_range())?;
    i64::try_from(if negative { -magnitude } else { magnitude }).map_err(|_| err_range())
}

/// `mantissa · 10^exp10 · scale · 1000`, rounded up; `None` on overflow.
/// `dropped_nonzero` says the true mantissa was a little larger than `mantissa`.
fn scale_to_milli(mantissa: u128, exp10: i64, dropped_nonzero: bool, scale: Scale) -> Option<u128> {
    let (binary_shift, decimal_exp) = match scale {
        Scale::Binary(n) => (10 * n, 0i64),
        Scale::Decimal(e) => (0, e),
    };
    let value = mantissa.checked_mul(1u128.checked_shl(binary_shift)?)?;
    let exp = decimal_exp.checked_add(3)?.checked_add(exp10)?;
    if exp >= 0 {
        // Digits are only dropped once the mantissa holds ~38 digits, which
        // overflows i64 here anyway, so exactness is not at stake in this branch.
        let mut v = value;
        for _ in 0..exp {
            v = v.checked_mul(10)?;
        }
        Some(v)
    } else {
        let mut v = value;
        let mut remainder = dropped_nonzero;
        let mut steps = exp.unsigned_abs();
        while steps > 0 && v > 0 {
            remainder |= v % 10 != 0;
            v /= 10;
            steps -= 1;
        }
        Some(if remainder { v + 1 } else { v })
    }
}

/// Canonical quantity string for a milli-unit value: a plain integer when the
/// value is whole (`"2"`), else the `m` form (`"1500m"`). Parses back exactly.
pub fn format_milli(milli: i64) -> String {
    if milli % 1000 == 0 {
        (milli / 1000).to_string()
    } else {
        format!("{milli}m")
    }
}

/// A quantity for people, the way Kubernetes users write it: whole values of at least one
/// MiB that are a multiple of 1024 take the largest binary suffix that divides them
/// (`274877906944` → `256Gi`), other whole values stay plain (`96`), fractions use milli
/// (`500m`). Parses back to the same value; counts below a MiB (CPUs, GPUs, pods) are never
/// given a binary suffix, so `cpu=1024` stays `1024`.
pub fn format_for_people(milli: i64) -> String {
    const KI: i64 = 1024;
    const SUFFIXES: [(&str, i64); 6] = [
        ("Ei", KI * KI * KI * KI * KI * KI),
        ("Pi", KI * KI * KI * KI * KI),
        ("Ti", KI * KI * KI * KI),
        ("Gi", KI * KI * KI),
        ("Mi", KI * KI),
        ("Ki", KI),
    ];
    if milli % 1000 != 0 {
        return format!("{milli}m");
    }
    let whole = milli / 1000;
    if whole.unsigned_abs() >= (KI * KI) as u64 {
        for (suffix, unit) in SUFFIXES {
            if whole % unit == 0 {
                return format!("{}{suffix}", whole / unit);
            }
        }
    }
    whole.to_string()
}

/// A quantity already parsed to milli-units; displays in canonical form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Milli(pub i64);

impl fmt::Display for Milli {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_milli(self.0))
    }
}

impl std::str::FromStr for Milli {
    type Err = QuantityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_quantity(s).map(Milli)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn q(s: &str) -> i64 {
        parse_quantity(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn suffix_table() {
        let table: &[(&str, i64)] = &[
            ("1", 1_000),
            ("0", 0),
            ("1m", 1),
            ("250m", 250),
            ("1k", 1_000_000),
            ("1M", 1_000_000_000),
            ("1G", 1_000_000_000_000),
            ("1T", 1_000_000_000_000_000),
            ("1P", 1_000_000_000_000_000_000),
            ("0.001E", 1_000_000_000_000_000_000),
            ("1Ki", 1_024_000),
            ("1Mi", 1_048_576_000),
            ("1Gi", 1_073_741_824_000),
            ("768Gi", 768 * 1_073_741_824_000),
            ("1Ti", 1_099_511_627_776_000),
            ("1Pi", 1_125_899_906_842_624_000),
            ("0.001Ei", 1_152_921_504_606_846_976),
            ("1e3", 1_000_000),
            ("1E3", 1_000_000),
            ("1e+3", 1_000_000),
            ("1e-3", 1),
            ("5e0", 5_000),
            ("1.5", 1_500),
            ("1.", 1_000),
            (".5", 500),
            ("+2", 2_000),
            ("-2", -2_000),
            ("-250m", -250),
            ("0.5Ki", 512_000),
            ("2.5e2", 250_000),
            ("007", 7_000),
        ];
        for &(input, milli) in table {
            assert_eq!(q(input), milli, "{input}");
        }
    }

    #[test]
    fn fractions_round_up_away_from_zero() {
        assert_eq!(q("1.5m"), 2);
        assert_eq!(q("0.1m"), 1);
        assert_eq!(q("-0.1m"), -1);
        assert_eq!(q("0.0001"), 1);
        assert_eq!(q("1e-9"), 1);
        assert_eq!(q("0.000000000000000000000000000000000000000000001"), 1);
        assert_eq!(q("1.000000000000000000000000000000000000000000000"), 1_000);
        // More significant fractional digits than u128 holds: still rounds up.
        assert_eq!(q("0.1234567890123456789012345678901234567890123"), 124);
        assert_eq!(q("0.0000"), 0);
    }

    #[test]
    fn rejects() {
        use QuantityError::*;
        type Check = fn(&QuantityError) -> bool;
        let cases: &[(&str, Check)] = &[
            ("", |e| *e == Empty),
            ("Ki", |e| matches!(e, NoDigits { .. })),
            (".", |e| matches!(e, NoDigits { .. })),
            ("-", |e| matches!(e, NoDigits { .. })),
            (" 1", |e| matches!(e, NoDigits { .. })),
            (
                "1ki",
                |e| matches!(e, UnknownSuffix { suffix, .. } if suffix == "ki"),
            ),
            ("1K", |e| matches!(e, UnknownSuffix { .. })),
            ("1 ", |e| matches!(e, UnknownSuffix { .. })),
            (
                "1.2.3",
                |e| matches!(e, UnknownSuffix { suffix, .. } if suffix == ".3"),
            ),
            ("1Mi ", |e| matches!(e, UnknownSuffix { .. })),
            ("1e", |e| matches!(e, BadExponent { .. })),
            ("1e3.5", |e| matches!(e, BadExponent { .. })),
            ("1e+", |e| matches!(e, BadExponent { .. })),
            ("1Eix", |e| matches!(e, BadExponent { .. })),
            ("1e3Ki", |e| matches!(e, BadExponent { .. })),
            ("1E", |e| matches!(e, OutOfRange { .. })),
            ("1Ei", |e| matches!(e, OutOfRange { .. })),
            ("9Pi", |e| matches!(e, OutOfRange { .. })),
            ("1e99999999999999999999", |e| matches!(e, OutOfRange { .. })),
            ("123456789012345678901234567890123456789012", |e| {
                matches!(e, OutOfRange { .. })
            }),
        ];
        for (input, check) in cases {
            let err = parse_quantity(input).unwrap_err();
            assert!(check(&err), "{input:?} gave {err:?}");
            assert!(!err.to_string().is_empty());
        }
    }

    #[test]
    fn extreme_exponents_with_tiny_or_zero_values() {
        assert_eq!(q("0e99999999999999999999"), 0);
        assert_eq!(q("1e-99999999999999999999"), 1);
        assert_eq!(q("-1e-99999999999999999999"), -1);
        assert_eq!(q("3e-400"), 1);
    }

    #[test]
    fn limits() {
        assert_eq!(q(&format!("{}m", i64::MAX)), i64::MAX);
        assert_eq!(q(&format!("{}m", i64::MIN)), i64::MIN);
        assert!(parse_quantity("9223372036854775808m").is_err());
    }

    #[test]
    fn people_format() {
        assert_eq!(format_for_people(274_877_906_944_000), "256Gi");
        assert_eq!(format_for_people(96_000), "96");
        assert_eq!(format_for_people(500), "500m");
        assert_eq!(
            format_for_people(1_024_000),
            "1024",
            "cpu counts keep no suffix"
        );
        assert_eq!(format_for_people(3 * 1024 * 1024 * 1000 + 1000), "3145729");
        assert_eq!(format_for_people(1536 * 1024 * 1024 * 1000), "1536Mi");
        assert_eq!(format_for_people(0), "0");
        assert_eq!(format_for_people(-2 * 1024 * 1024 * 1024 * 1000), "-2Gi");
        for m in [
            274_877_906_944_000,
            96_000,
            500,
            1_024_000,
            1536 * 1024 * 1024 * 1000,
        ] {
            assert_eq!(q(&format_for_people(m)), m, "round trip of {m}");
        }
    }

    #[test]
    fn canonical_format() {
        assert_eq!(format_milli(1_000), "1");
        assert_eq!(format_milli(1_500), "1500m");
        assert_eq!(format_milli(0), "0");
        assert_eq!(format_milli(-2_000), "-2");
        assert_eq!(Milli(250).to_string(), "250m");
        assert_eq!("2Ki".parse::<Milli>(), Ok(Milli(2_048_000)));
    }

    const SUFFIXES: [(&str, i128); 14] = [
        ("", 1_000),
        ("m", 1),
        ("k", 1_000_000),
        ("M", 1_000_000_000),
        ("G", 1_000_000_000_000),
        ("T", 1_000_000_000_000_000),
        ("P", 1_000_000_000_000_000_000),
        ("E", 1_000_000_000_000_000_000_000),
        ("Ki", 1_024_000),
        ("Mi", 1_048_576_000),
        ("Gi", 1_073_741_824_000),
        ("Ti", 1_099_511_627_776_000),
        ("Pi", 1_125_899_906_842_624_000),
        ("Ei", 1_152_921_504_606_846_976_000),
    ];

    proptest! {
        #[test]
        fn format_round_trips(milli in any::<i64>()) {
            prop_assert_eq!(parse_quantity(&format_milli(milli)), Ok(milli));
        }

        #[test]
        fn integer_with_suffix_is_exact_or_out_of_range(n in 0u32..100_000, s in 0usize..14) {
            let (suffix, per_unit) = SUFFIXES[s];
            let expected = i128::from(n) * per_unit;
            let got = parse_quantity(&format!("{n}{suffix}"));
            match i64::try_from(expected) {
                Ok(e) => prop_assert_eq!(got, Ok(e)),
                Err(_) => {
                    let out_of_range = matches!(got, Err(QuantityError::OutOfRange { .. }));
                    prop_assert!(out_of_range);
                }
            }
        }

        #[test]
        fn ordering_is_preserved(a in 0u32..1_000_000, b in 0u32..1_000_000, s in 0usize..7) {
            let suffix = ["", "m", "k", "Ki", "Mi", "Gi", "M"][s];
            let (qa, qb) = (q(&format!("{a}{suffix}")), q(&format!("{b}{suffix}")));
            prop_assert_eq!(a.cmp(&b), qa.cmp(&qb));
        }

        #[test]
        fn exponent_equals_decimal_suffix(n in 0u32..1_000, e in 0usize..5) {
            let (suffix, exp) = [("", 0), ("k", 3), ("M", 6), ("G", 9), ("T", 12)][e];
            prop_assert_eq!(q(&format!("{n}e{exp}")), q(&format!("{n}{suffix}")));
            prop_assert_eq!(q(&format!("{n}E{exp}")), q(&format!("{n}{suffix}")));
        }

        #[test]
        fn decimal_fraction_matches_milli(whole in 0u32..1_000_000, frac in 0u32..1000) {
            let decimal = format!("{whole}.{frac:03}");
            prop_assert_eq!(q(&decimal), i64::from(whole) * 1000 + i64::from(frac));
        }

        #[test]
        fn arbitrary_input_never_panics(s in ".{0,40}") {
            let _ = parse_quantity(&s);
        }

        #[test]
        fn quantity_shaped_input_never_panics(s in "[+-]?[0-9]{0,45}(\\.[0-9]{0,45})?([eE][+-]?[0-9]{0,25}|[mkMGTPE]i?)?") {
            let _ = parse_quantity(&s);
        }
    }
}
