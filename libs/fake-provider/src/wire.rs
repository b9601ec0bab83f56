//! Just enough protobuf wire encoding to write `MachineList` without building a
//! `Machine` value per record.
//!
//! Why: a full List of 500K machines through prost would clone ~25 strings and three maps
//! per machine before encoding them. Instead each record's static part (instance type,
//! zone, cost, resources, labels) is encoded once per template, and List writes only the
//! few per-machine fields around it. Protobuf allows fields in any order, so the result
//! decodes to exactly the `Machine` a prost encoder would have produced; the tests check
//! that against prost.

use bytes::BufMut;

const LEN: u64 = 2;
const VARINT: u64 = 0;

pub(crate) fn varint_len(v: u64) -> usize {
    // 7 payload bits per byte; `| 1` makes 0 take one byte.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

pub(crate) fn put_varint(buf: &mut impl BufMut, mut v: u64) {
    while v >= 0x80 {
        buf.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    buf.put_u8(v as u8);
}

fn key(tag: u32, wire_type: u64) -> u64 {
    (u64::from(tag) << 3) | wire_type
}

/// Length of a length-delimited field with `payload` bytes (key + length + payload).
pub(crate) fn len_field_len(tag: u32, payload: usize) -> usize {
    varint_len(key(tag, LEN)) + varint_len(payload as u64) + payload
}

/// Header of a length-delimited field whose payload the caller writes next.
pub(crate) fn put_len_header(buf: &mut impl BufMut, tag: u32, payload: usize) {
    put_varint(buf, key(tag, LEN));
    put_varint(buf, payload as u64);
}

/// A proto3 string/bytes field; empty values are omitted, as prost does.
pub(crate) fn str_len(tag: u32, s: &[u8]) -> usize {
    if s.is_empty() {
        0
    } else {
        len_field_len(tag, s.len())
    }
}

pub(crate) fn put_str(buf: &mut impl BufMut, tag: u32, s: &[u8]) {
    if !s.is_empty() {
        put_len_header(buf, tag, s.len());
        buf.put_slice(s);
    }
}

/// A non-negative enum/int field; zero is omitted.
pub(crate) fn enum_len(tag: u32, v: i32) -> usize {
    if v == 0 {
        0
    } else {
        varint_len(key(tag, VARINT)) + varint_len(v as i64 as u64)
    }
}

pub(crate) fn put_enum(buf: &mut impl BufMut, tag: u32, v: i32) {
    if v != 0 {
        put_varint(buf, key(tag, VARINT));
        put_varint(buf, v as i64 as u64);
    }
}

/// One `map<string, string>` entry's payload length (key = 1, value = 2).
pub(crate) fn map_entry_payload(k: &str, v: &str) -> usize {
    str_len(1, k.as_bytes()) + str_len(2, v.as_bytes())
}

pub(crate) fn map_len<'a>(
    tag: u32,
    entries: impl Iterator<Item = (&'a String, &'a String)>,
) -> usize {
    entries
        .map(|(k, v)| len_field_len(tag, map_entry_payload(k, v)))
        .sum()
}

pub(crate) fn put_map<'a>(
    buf: &mut impl BufMut,
    tag: u32,
    entries: impl Iterator<Item = (&'a String, &'a String)>,
) {
    for (k, v) in entries {
        put_len_header(buf, tag, map_entry_payload(k, v));
        put_str(buf, 1, k.as_bytes());
        put_str(buf, 2, v.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn varint_len_matches_encoding(v in any::<u64>()) {
            let mut buf = Vec::new();
            put_varint(&mut buf, v);
            prop_assert_eq!(buf.len(), varint_len(v));
            prop_assert_eq!(prost::encoding::decode_varint(&mut buf.as_slice()).unwrap(), v);
        }
    }

    #[test]
    fn varint_edges() {
        for (v, n) in [
            (0u64, 1),
            (127, 1),
            (128, 2),
            (16_383, 2),
            (16_384, 3),
            (u64::MAX, 10),
        ] {
            assert_eq!(varint_len(v), n, "{v}");
        }
    }
}
