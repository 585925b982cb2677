//! The Python client's hand-written wire schema (`host-shim/python/src/
//! sluice/_wire.py`) and error codes (`errors.py`) against the `.proto`
//! files as protoc compiled them (`sluice_proto::FILE_DESCRIPTOR_SET`): every
//! shim message and field with the same number, name, type and label, every
//! enum value the client names. A field added to `shim.proto` and not to the
//! client fails here, not in a user's loader.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FileDescriptorSet};

/// What the Python client declares, as JSON.
fn python_side() -> serde_json::Value {
    let python = std::env::var("SLUICE_TEST_PYTHON").unwrap_or_else(|_| {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python").to_string_lossy().into_owned()
    });
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../host-shim/python/src");
    let script = r#"
import json
from sluice import _wire, errors, types
print(json.dumps({
    "schema": {m: {str(n): list(f) for n, f in fields.items()} for m, fields in _wire.SCHEMA.items()},
    "error_codes": {c.name: int(c) for c in errors.ErrorCode},
    "data_paths": {str(k): v for k, v in types.DATA_PATHS.items()},
    "capability_names": {
        name: {str(k): v for k, v in table.items()}
        for name, table in [("MemoryKind", types.MEMORY_KINDS), ("DataPathMode", types.DATA_PATH_MODES),
            ("Transport", types.TRANSPORTS), ("Placement", types.PLACEMENTS),
            ("Encryption", types.ENCRYPTIONS), ("Access", types.ACCESS),
            ("StoreChecksums", types.STORE_CHECKSUMS)]
    },
    "protocol_version": _wire.PROTOCOL_VERSION,
    "max_frame_len": _wire.MAX_FRAME_LEN,
    "region_kinds": {"SHARED_MEMORY": _wire.REGION_KIND_SHARED_MEMORY, "GPU_DMABUF": _wire.REGION_KIND_GPU_DMABUF},
}))
"#;
    let out =
        Command::new(&python).args(["-c", script]).env("PYTHONPATH", &src).output().unwrap_or_else(|e| {
            panic!("running {python}: {e} (scripts/test creates .venv; or set SLUICE_TEST_PYTHON)")
        });
    assert!(out.status.success(), "dumping the Python schema failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Messages and enums of `sluice.common.v1` and `sluice.shim.v1`, by name.
struct Protos {
    messages: BTreeMap<String, (String, DescriptorProto)>,
    enums: BTreeMap<String, BTreeMap<String, i32>>,
}

fn protos() -> Protos {
    let set = FileDescriptorSet::decode(sluice_proto::FILE_DESCRIPTOR_SET).unwrap();
    let mut messages = BTreeMap::new();
    let mut enums = BTreeMap::new();
    for file in set.file {
        let package = file.package().to_owned();
        if package != "sluice.common.v1" && package != "sluice.shim.v1" {
            continue;
        }
        for m in file.message_type {
            assert!(m.nested_type.is_empty(), "{}: nested messages are not described here", m.name());
            let dup = messages.insert(m.name().to_owned(), (package.clone(), m));
            assert!(dup.is_none(), "a message name is used by both packages");
        }
        for e in file.enum_type {
            enums.insert(e.name().to_owned(), e.value.iter().map(|v| (v.name().to_owned(), v.number())).collect());
        }
    }
    Protos { messages, enums }
}

/// `(name, kind, label)` as `_wire.SCHEMA` spells a field.
fn expected_field(m: &DescriptorProto, f: &prost_types::FieldDescriptorProto) -> [String; 3] {
    let kind = match f.r#type() {
        Type::Uint64 => "u64".to_owned(),
        Type::Uint32 => "u32".to_owned(),
        Type::Int64 => "i64".to_owned(),
        Type::Bool => "bool".to_owned(),
        Type::Enum => "enum".to_owned(),
        Type::String => "string".to_owned(),
        Type::Message => f.type_name().rsplit('.').next().unwrap().to_owned(),
        other => panic!("{}.{}: type {other:?} is not supported by the Python codec", m.name(), f.name()),
    };
    let label = if f.label() == Label::Repeated {
        "repeated".to_owned()
    } else if f.proto3_optional() {
        "optional".to_owned()
    } else if let Some(i) = f.oneof_index {
        format!("oneof:{}", m.oneof_decl[i as usize].name())
    } else {
        String::new()
    };
    [f.name().to_owned(), kind, label]
}

#[test]
fn the_python_wire_schema_matches_the_protos() {
    let py = python_side();
    let protos = protos();
    let schema = py["schema"].as_object().unwrap();
    let mut mismatches = Vec::new();

    // Every shim message is described, and nothing that is not a message.
    let described: BTreeSet<&str> = schema.keys().map(String::as_str).collect();
    for (name, (package, _)) in &protos.messages {
        if package == "sluice.shim.v1" && !described.contains(name.as_str()) {
            mismatches.push(format!("{name}: in shim.proto, missing from _wire.SCHEMA"));
        }
    }
    for (name, fields) in schema {
        let Some((_, m)) = protos.messages.get(name) else {
            mismatches.push(format!("{name}: in _wire.SCHEMA, no such message in common.proto or shim.proto"));
            continue;
        };
        let py_fields = fields.as_object().unwrap();
        for f in &m.field {
            let want = expected_field(m, f);
            match py_fields.get(&f.number().to_string()) {
                None => mismatches.push(format!("{name}.{} = {}: missing from _wire.SCHEMA", f.name(), f.number())),
                Some(got) => {
                    let got: Vec<String> = serde_json::from_value(got.clone()).unwrap();
                    if got != want {
                        mismatches
                            .push(format!("{name} field {}: _wire.SCHEMA has {got:?}, the proto {want:?}", f.number()));
                    }
                }
            }
        }
        let numbers: BTreeSet<String> = m.field.iter().map(|f| f.number().to_string()).collect();
        for n in py_fields.keys().filter(|n| !numbers.contains(*n)) {
            mismatches.push(format!("{name} field {n}: in _wire.SCHEMA, not in the proto"));
        }
    }

    // Enum values the client names.
    let codes: BTreeMap<String, i32> = serde_json::from_value(py["error_codes"].clone()).unwrap();
    if codes != protos.enums["ErrorCode"] {
        mismatches
            .push(format!("errors.ErrorCode {codes:?} != common.proto ErrorCode {:?}", protos.enums["ErrorCode"]));
    }
    for (name, number) in &protos.enums["DataPath"] {
        let label = if *number == 0 { "unknown".to_owned() } else { name.to_lowercase().replace('_', "-") };
        if py["data_paths"][number.to_string()] != label.as_str() {
            mismatches.push(format!("types.DATA_PATHS[{number}] should be {label:?} (DataPath.{name})"));
        }
    }
    // The capability enums' names, as config files spell them: the enum's
    // prefix dropped, lower case, `-` for `_`; 0 is "unknown".
    for (name, prefix) in [
        ("MemoryKind", ""),
        ("DataPathMode", "DATA_PATH_MODE_"),
        ("Transport", "TRANSPORT_"),
        ("Placement", "PLACEMENT_"),
        ("Encryption", "ENCRYPTION_"),
        ("Access", "ACCESS_"),
        ("StoreChecksums", "STORE_CHECKSUMS_"),
    ] {
        let table = &py["capability_names"][name];
        for (value, number) in &protos.enums[name] {
            let label = match number {
                0 => "unknown".to_owned(),
                _ => value.strip_prefix(prefix).unwrap_or(value).to_lowercase().replace('_', "-"),
            };
            if table[number.to_string()] != label.as_str() {
                mismatches.push(format!("the Python name of {name}.{value} ({number}) should be {label:?}"));
            }
        }
        if table.as_object().map_or(0, |t| t.len()) != protos.enums[name].len() {
            mismatches.push(format!("the Python table of {name} names other values than the proto"));
        }
    }
    let kinds: BTreeMap<String, i32> = serde_json::from_value(py["region_kinds"].clone()).unwrap();
    if kinds != protos.enums["RegionKind"] {
        mismatches
            .push(format!("_wire REGION_KIND_* {kinds:?} != shim.proto RegionKind {:?}", protos.enums["RegionKind"]));
    }
    if py["protocol_version"] != protos.enums["Version"]["VERSION_1"] {
        mismatches.push("_wire.PROTOCOL_VERSION is not shim.proto's VERSION_1".into());
    }
    if py["max_frame_len"] != sluice_proto::MAX_FRAME_LEN {
        mismatches.push("_wire.MAX_FRAME_LEN is not sluice_proto::MAX_FRAME_LEN".into());
    }
    assert!(mismatches.is_empty(), "the Python client disagrees with the protos:\n  {}", mismatches.join("\n  "));
    // Not vacuous: the comparison saw the whole shim protocol.
    assert!(schema.len() >= 20 && protos.enums.len() >= 4, "{} messages, {} enums", schema.len(), protos.enums.len());
}
