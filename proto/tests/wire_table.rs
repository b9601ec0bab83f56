//! The wire contract as compiled, checked against `proto/wire-table.txt`.
//!
//! The table is written by hand from the reference fact sheet; this test
//! derives the same kind of lines from the encoded descriptor set the crate
//! exports and requires the two sets to be equal. Any renumbered, retyped,
//! renamed, added or removed public field, enum value, reserved number,
//! message or RPC (and any change to the internal RPC list) fails here.

use std::collections::{BTreeMap, BTreeSet};

use prost::Message as _;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, EnumDescriptorProto, FieldDescriptorProto, FileDescriptorSet};

const TABLE: &str = include_str!("../wire-table.txt");
const PUBLIC: &str = "bigfleet.v1alpha1";
const MESH: &str = "bigfleet.mesh.v1";

fn descriptor_set() -> FileDescriptorSet {
    FileDescriptorSet::decode(bigfleet_proto::FILE_DESCRIPTOR_SET)
        .expect("FILE_DESCRIPTOR_SET decodes as a FileDescriptorSet")
}

/// Table lines with comments and blank lines removed, whitespace normalised.
fn table_lines() -> Vec<String> {
    TABLE
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

fn scalar_name(t: Type) -> &'static str {
    match t {
        Type::Double => "double",
        Type::Float => "float",
        Type::Int64 => "int64",
        Type::Uint64 => "uint64",
        Type::Int32 => "int32",
        Type::Fixed64 => "fixed64",
        Type::Fixed32 => "fixed32",
        Type::Bool => "bool",
        Type::String => "string",
        Type::Group => "group",
        Type::Message => "message",
        Type::Bytes => "bytes",
        Type::Uint32 => "uint32",
        Type::Enum => "enum",
        Type::Sfixed32 => "sfixed32",
        Type::Sfixed64 => "sfixed64",
        Type::Sint32 => "sint32",
        Type::Sint64 => "sint64",
    }
}

/// Type of a field without its label: scalar name or full type name.
fn bare_type(field: &FieldDescriptorProto) -> String {
    match field.r#type() {
        Type::Message | Type::Enum => field.type_name().trim_start_matches('.').to_owned(),
        other => scalar_name(other).to_owned(),
    }
}

/// The nested map-entry message a field points at, if it is a map field.
fn map_entry<'a>(
    msg: &'a DescriptorProto,
    field: &FieldDescriptorProto,
) -> Option<&'a DescriptorProto> {
    if field.label() != Label::Repeated || field.r#type() != Type::Message {
        return None;
    }
    let entry_name = field.type_name().rsplit('.').next()?;
    msg.nested_type
        .iter()
        .find(|n| n.name() == entry_name && n.options.as_ref().is_some_and(|o| o.map_entry()))
}

fn field_type(msg: &DescriptorProto, field: &FieldDescriptorProto) -> String {
    if let Some(entry) = map_entry(msg, field) {
        let kv: BTreeMap<i32, String> = entry
            .field
            .iter()
            .map(|f| (f.number(), bare_type(f)))
            .collect();
        return format!("map<{},{}>", kv[&1], kv[&2]);
    }
    let bare = bare_type(field);
    match field.label() {
        Label::Repeated => format!("repeated {bare}"),
        Label::Required => format!("required {bare}"),
        Label::Optional if field.proto3_optional() => format!("optional {bare}"),
        Label::Optional => bare,
    }
}

fn enum_lines(full: &str, e: &EnumDescriptorProto, out: &mut BTreeSet<String>) {
    for v in &e.value {
        out.insert(format!("enum {full} {} {}", v.name(), v.number()));
    }
}

fn message_lines(prefix: &str, msg: &DescriptorProto, out: &mut BTreeSet<String>) {
    if msg.options.as_ref().is_some_and(|o| o.map_entry()) {
        return; // described by the parent's map<k,v> field
    }
    let full = format!("{prefix}.{}", msg.name());
    out.insert(format!("message {full}"));
    for field in &msg.field {
        let mut line = format!(
            "field {full}.{} {} {}",
            field.name(),
            field.number(),
            field_type(msg, field)
        );
        if let Some(idx) = field.oneof_index
            && !field.proto3_optional()
        {
            let oneof =
                msg.oneof_decl[usize::try_from(idx).expect("oneof index fits usize")].name();
            line.push_str(&format!(" oneof={oneof}"));
        }
        out.insert(line);
    }
    for range in &msg.reserved_range {
        for n in range.start()..range.end() {
            out.insert(format!("reserved {full} {n}"));
        }
    }
    for name in &msg.reserved_name {
        out.insert(format!("reserved-name {full} {name}"));
    }
    for e in &msg.enum_type {
        enum_lines(&format!("{full}.{}", e.name()), e, out);
    }
    for nested in &msg.nested_type {
        message_lines(&full, nested, out);
    }
}

/// Lines derived from the compiled descriptor: everything of the public
/// package, plus the RPC list of the internal package.
fn described_lines(fds: &FileDescriptorSet) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for file in &fds.file {
        let pkg = file.package();
        if pkg == PUBLIC {
            out.insert(format!("file {} {pkg}", file.name()));
            for msg in &file.message_type {
                message_lines(pkg, msg, &mut out);
            }
            for e in &file.enum_type {
                enum_lines(&format!("{pkg}.{}", e.name()), e, &mut out);
            }
        }
        if pkg == PUBLIC || pkg == MESH {
            for svc in &file.service {
                for m in &svc.method {
                    let kind = match (m.client_streaming(), m.server_streaming()) {
                        (false, false) => "unary",
                        (false, true) => "server-stream",
                        (true, false) => "client-stream",
                        (true, true) => "bidi",
                    };
                    out.insert(format!(
                        "rpc {pkg}.{}.{} {} {} {kind}",
                        svc.name(),
                        m.name(),
                        m.input_type().trim_start_matches('.'),
                        m.output_type().trim_start_matches('.'),
                    ));
                }
            }
        }
    }
    out
}

/// (lines only in the table, lines only in the descriptor).
fn diff(table: &BTreeSet<String>, described: &BTreeSet<String>) -> (Vec<String>, Vec<String>) {
    (
        table.difference(described).cloned().collect(),
        described.difference(table).cloned().collect(),
    )
}

#[test]
fn table_is_well_formed() {
    let lines = table_lines();
    let mut seen = BTreeSet::new();
    let mut numbers: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in &lines {
        assert!(seen.insert(line.clone()), "duplicate table line: {line}");
        let t: Vec<&str> = line.split(' ').collect();
        let ok = match t[0] {
            "file" => t.len() == 3,
            "message" => t.len() == 2,
            "field" => (4..=6).contains(&t.len()) && t[2].parse::<u32>().is_ok(),
            "reserved" => t.len() == 3 && t[2].parse::<u32>().is_ok(),
            "enum" => t.len() == 4 && t[3].parse::<i32>().is_ok(),
            "rpc" => {
                t.len() == 5 && ["unary", "server-stream", "client-stream", "bidi"].contains(&t[4])
            }
            _ => false,
        };
        assert!(ok, "malformed table line: {line}");
        // A number may be used once per message, by a field or a reservation.
        let slot = match t[0] {
            "field" => Some((
                t[1].rsplit_once('.')
                    .expect("field path has a dot")
                    .0
                    .to_owned(),
                t[2],
            )),
            "reserved" => Some((t[1].to_owned(), t[2])),
            _ => None,
        };
        if let Some((msg, n)) = slot {
            assert!(
                numbers.entry(msg.clone()).or_default().insert(n.to_owned()),
                "number {n} used twice in {msg} in the table"
            );
        }
    }
    assert!(
        lines.len() > 300,
        "table looks truncated: {} lines",
        lines.len()
    );
}

#[test]
fn public_contract_matches_the_table_exactly() {
    let table: BTreeSet<String> = table_lines().into_iter().collect();
    let described = described_lines(&descriptor_set());
    let (missing, unexpected) = diff(&table, &described);
    assert!(
        missing.is_empty() && unexpected.is_empty(),
        "wire contract differs from proto/wire-table.txt\n\
         in the table but not compiled:\n  {}\ncompiled but not in the table:\n  {}",
        missing.join("\n  "),
        unexpected.join("\n  "),
    );
}

#[test]
fn the_comparison_catches_a_renumbered_field_and_a_dropped_reservation() {
    let described = described_lines(&descriptor_set());
    let mut tampered: BTreeSet<String> = table_lines().into_iter().collect();
    assert!(tampered.remove("field bigfleet.v1alpha1.CapacityNeed.group 9 string"));
    tampered.insert("field bigfleet.v1alpha1.CapacityNeed.group 10 string".to_owned());
    assert!(tampered.remove("reserved bigfleet.v1alpha1.Machine 11"));
    let (missing, unexpected) = diff(&tampered, &described);
    assert_eq!(
        missing,
        vec!["field bigfleet.v1alpha1.CapacityNeed.group 10 string".to_owned()]
    );
    assert_eq!(
        unexpected,
        vec![
            "field bigfleet.v1alpha1.CapacityNeed.group 9 string".to_owned(),
            "reserved bigfleet.v1alpha1.Machine 11".to_owned(),
        ]
    );
}

#[test]
fn reserved_numbers_are_reserved_and_unused() {
    let fds = descriptor_set();
    let mut messages: BTreeMap<String, &DescriptorProto> = BTreeMap::new();
    fn index<'a>(
        prefix: &str,
        msg: &'a DescriptorProto,
        out: &mut BTreeMap<String, &'a DescriptorProto>,
    ) {
        let full = format!("{prefix}.{}", msg.name());
        for nested in &msg.nested_type {
            index(&full, nested, out);
        }
        out.insert(full, msg);
    }
    for file in fds.file.iter().filter(|f| f.package() == PUBLIC) {
        for msg in &file.message_type {
            index(PUBLIC, msg, &mut messages);
        }
    }
    let reserved: Vec<(String, i32)> = table_lines()
        .iter()
        .filter_map(|l| l.strip_prefix("reserved "))
        .map(|rest| {
            let (msg, n) = rest.split_once(' ').expect("reserved line has a number");
            (msg.to_owned(), n.parse().expect("reserved number parses"))
        })
        .collect();
    // The reference lists 13 reserved numbers across the public messages.
    assert_eq!(
        reserved.len(),
        13,
        "reserved lines in the table: {reserved:?}"
    );
    for (msg, n) in reserved {
        let d = messages
            .get(&msg)
            .unwrap_or_else(|| panic!("message {msg} missing"));
        assert!(
            d.reserved_range
                .iter()
                .any(|r| r.start() <= n && n < r.end()),
            "{msg}: number {n} is not reserved"
        );
        assert!(
            d.field.iter().all(|f| f.number() != n),
            "{msg}: reserved number {n} is used by a field"
        );
    }
}

#[test]
fn descriptor_holds_the_mesh_services() {
    let fds = descriptor_set();
    let mesh: BTreeMap<String, (String, Vec<String>)> = fds
        .file
        .iter()
        .filter(|f| f.package() == MESH)
        .flat_map(|f| {
            f.service.iter().map(move |s| {
                let rpcs = s.method.iter().map(|m| m.name().to_owned()).collect();
                (s.name().to_owned(), (f.name().to_owned(), rpcs))
            })
        })
        .collect();
    let expect = [
        (
            "Ingest",
            "bigfleet/mesh/v1/decide.proto",
            &["ApplyRollup", "SessionOpened", "SessionClosed"][..],
        ),
        (
            "Work",
            "bigfleet/mesh/v1/decide.proto",
            &["Pull", "Transition"][..],
        ),
        (
            "Outbox",
            "bigfleet/mesh/v1/gateway.proto",
            &["Publish", "Status"][..],
        ),
        (
            "Relay",
            "bigfleet/mesh/v1/gateway.proto",
            &["RequestBootstrap", "SendReclaim"][..],
        ),
        (
            "Raft",
            "bigfleet/mesh/v1/raft.proto",
            &["AppendEntries", "Vote", "InstallSnapshot"][..],
        ),
        (
            "Inspect",
            "bigfleet/mesh/v1/inspect.proto",
            &["FleetSummary", "RecentActions", "ListMachines"][..],
        ),
        (
            "CoordinatorInfo",
            "bigfleet/mesh/v1/coordinator.proto",
            &["ListTransfers"][..],
        ),
    ];
    for (svc, file, rpcs) in expect {
        let (got_file, got_rpcs) = mesh
            .get(svc)
            .unwrap_or_else(|| panic!("mesh service {svc} missing: {mesh:?}"));
        assert_eq!(got_file, file, "{svc} lives in the wrong file");
        assert_eq!(got_rpcs, rpcs, "{svc} RPCs");
    }
    // Every mesh and public service name is exported as a constant.
    let names = [
        bigfleet_proto::service_names::INGEST,
        bigfleet_proto::service_names::WORK,
        bigfleet_proto::service_names::OUTBOX,
        bigfleet_proto::service_names::RELAY,
        bigfleet_proto::service_names::RAFT,
        bigfleet_proto::service_names::INSPECT,
        bigfleet_proto::service_names::SHARD_INFO,
        bigfleet_proto::service_names::CAPACITY_PROVIDER,
        bigfleet_proto::service_names::SHARD,
        bigfleet_proto::service_names::SHARD_READ,
        bigfleet_proto::service_names::COORDINATOR,
        bigfleet_proto::service_names::COORDINATOR_INFO,
    ];
    let compiled: BTreeSet<String> = fds
        .file
        .iter()
        .flat_map(|f| {
            f.service
                .iter()
                .map(move |s| format!("{}.{}", f.package(), s.name()))
        })
        .collect();
    let exported: BTreeSet<String> = names.iter().map(|s| (*s).to_owned()).collect();
    assert_eq!(compiled, exported);
}

#[test]
fn generated_rust_types_put_fields_on_the_table_numbers() {
    use bigfleet_proto::v1alpha1 as pb;
    // Field 9, wire type 2 (length-delimited): tag byte (9 << 3) | 2 = 0x4a.
    let need = pb::CapacityNeed {
        group: "g".into(),
        ..Default::default()
    };
    assert_eq!(need.encode_to_vec(), vec![0x4a, 1, b'g']);
    // A oneof member encodes under its own number: rollup = 2.
    let msg = pb::OperatorMessage {
        payload: Some(pb::operator_message::Payload::Rollup(
            pb::ClusterCapacityNeeds::default(),
        )),
    };
    assert_eq!(msg.encode_to_vec(), vec![0x12, 0]);
    // Enum values: MACHINE_STATE_FAILED = 8 on field 2 (varint): 0x10 0x08.
    let machine = pb::Machine {
        state: pb::MachineState::Failed.into(),
        ..Default::default()
    };
    assert_eq!(machine.encode_to_vec(), vec![0x10, 8]);
    // The old Delete request (MachineRef) decodes as DeleteRequest.
    let old = pb::MachineRef { id: "m-1".into() }.encode_to_vec();
    assert_eq!(
        pb::DeleteRequest::decode(old.as_slice())
            .expect("decodes")
            .machine_id,
        "m-1"
    );
}
