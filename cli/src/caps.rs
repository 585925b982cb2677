//! `sluice stat --caps`: what this connection can do, as the shim and agent
//! told it at the handshake (capability exchange).

use serde_json::json;
use sluice_client::{Capabilities, NamespaceCapabilities};

/// A protobuf enum value's name without its type prefix, as a config file
/// spells it: `TRANSPORT_VERBS_RC` -> `verbs-rc`.
fn short(name: &str, prefix: &str) -> String {
    name.strip_prefix(prefix).unwrap_or(name).to_ascii_lowercase().replace('_', "-")
}

fn memory(kinds: impl Iterator<Item = sluice_client::MemoryKind>) -> Vec<String> {
    kinds.map(|k| short(k.as_str_name(), "")).collect()
}

fn namespace_json(n: &NamespaceCapabilities) -> serde_json::Value {
    json!({
        "name": n.name,
        "access": n.access().map(|a| short(a.as_str_name(), "ACCESS_")).collect::<Vec<_>>(),
        "data_path": short(n.data_path().as_str_name(), "DATA_PATH_MODE_"),
        "transport": short(n.transport().as_str_name(), "TRANSPORT_"),
        "degraded_reason": n.degraded_reason,
        "placement": short(n.placement().as_str_name(), "PLACEMENT_"),
        "encryption": short(n.encryption().as_str_name(), "ENCRYPTION_"),
        "max_object_bytes": n.max_object_bytes,
        "max_window_bytes": n.max_window_bytes,
        "get_part_bytes": n.get_part_bytes,
        "put_part_bytes": n.put_part_bytes,
        "rdma_min_bytes": n.rdma_min_bytes,
        "request_timeout_ms": n.request_timeout_ms,
        "store_checksums": short(n.store_checksums().as_str_name(), "STORE_CHECKSUMS_").replace("unspecified", "unknown"),
    })
}

/// The capabilities as one JSON object (only `namespace`'s, if given).
pub fn to_json(c: &Capabilities, namespace: Option<&str>) -> serde_json::Value {
    let namespaces: Vec<_> =
        c.namespaces.iter().filter(|n| namespace.is_none_or(|want| n.name == want)).map(namespace_json).collect();
    json!({
        "agent_memory": memory(c.agent_memory()),
        "shim_memory": memory(c.shim_memory()),
        "gpu_staging": c.gpu_staging,
        "max_batch_items": c.max_batch_items,
        "max_region_bytes": c.max_region_bytes,
        "max_registered_bytes": c.max_registered_bytes,
        "namespaces": namespaces,
    })
}

fn bytes(n: u64) -> String {
    const UNITS: [(&str, u64); 4] = [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    match UNITS.iter().find(|(_, u)| n >= *u && n.is_multiple_of(*u)) {
        Some((name, u)) => format!("{} {name}", n / u),
        None => format!("{n} B"),
    }
}

/// The capabilities for a reader.
pub fn to_text(c: &Capabilities, namespace: Option<&str>) -> String {
    let both: Vec<String> = memory(c.agent_memory().filter(|k| c.shim_memory().any(|s| s == *k)));
    let mut out = format!(
        "region memory:   {} (agent reaches: {}; shim registers: {})\n",
        if both.is_empty() { "none: no region can be registered".to_owned() } else { both.join(", ") },
        memory(c.agent_memory()).join(", "),
        memory(c.shim_memory()).join(", "),
    );
    if !c.gpu_staging.is_empty() {
        out += &format!("gpu staging:     {}\n", c.gpu_staging);
    }
    out += &format!(
        "limits:          {} per region, {} registered per session, {} GETs per batch\n",
        bytes(c.max_region_bytes),
        bytes(c.max_registered_bytes),
        c.max_batch_items
    );
    for n in c.namespaces.iter().filter(|n| namespace.is_none_or(|want| n.name == want)) {
        let j = namespace_json(n);
        let s = |k: &str| j[k].as_str().unwrap_or_default().to_owned();
        let access: Vec<&str> =
            j["access"].as_array().map_or(vec![], |a| a.iter().filter_map(|v| v.as_str()).collect());
        out += &format!("namespace {}:\n", n.name);
        out += &format!("  access:        {}\n", access.join(", "));
        out += &format!(
            "  data path:     {} (transport {}, placement {})\n",
            s("data_path"),
            s("transport"),
            s("placement")
        );
        if !n.degraded_reason.is_empty() {
            out += &format!("  degraded:      {}\n", n.degraded_reason);
        }
        out += &format!("  encryption:    {}\n", s("encryption"));
        out += &format!(
            "  checksums:     {}\n",
            match s("store_checksums").as_str() {
                "kept" => "the store checks, keeps and returns them".to_owned(),
                "ignored" => "the store ignores them: Content-MD5 on uploads, reads checked against the CRC64NVME \
                              in each object's metadata"
                    .to_owned(),
                other => format!("{other} (no reply from the store has told yet)"),
            }
        );
        out += &format!(
            "  limits:        objects up to {}, parts of {} (GET) / {} (PUT){}, {} s per request\n",
            bytes(n.max_object_bytes),
            bytes(n.get_part_bytes),
            bytes(n.put_part_bytes),
            if n.max_window_bytes > 0 {
                format!(", RDMA windows up to {}", bytes(n.max_window_bytes))
            } else {
                String::new()
            },
            n.request_timeout_ms / 1000
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proto::common::{Access, DataPathMode, Encryption, MemoryKind, Placement, Transport};

    fn caps() -> Capabilities {
        Capabilities {
            agent_memory: vec![MemoryKind::DocaHost as i32, MemoryKind::GpuDmabuf as i32],
            shim_memory: vec![MemoryKind::DocaHost as i32, MemoryKind::GpuDmabuf as i32],
            gpu_staging: "DOCA DMA through 4194304 bytes of DPU memory on 03:00.0".into(),
            max_batch_items: 1024,
            max_region_bytes: 16 << 30,
            max_registered_bytes: 64 << 30,
            namespaces: vec![NamespaceCapabilities {
                name: "data".into(),
                access: vec![Access::Read as i32, Access::List as i32],
                data_path: DataPathMode::Auto as i32,
                transport: Transport::VerbsRc as i32,
                placement: Placement::Direct as i32,
                encryption: Encryption::Aes256Gcm as i32,
                max_object_bytes: 10_000 * (8 << 20),
                max_window_bytes: (4 << 30) - (64 << 10),
                get_part_bytes: 8 << 20,
                put_part_bytes: 8 << 20,
                rdma_min_bytes: 1 << 20,
                request_timeout_ms: 300_000,
                ..Default::default()
            }],
        }
    }

    #[test]
    fn names_read_like_the_config() {
        let j = to_json(&caps(), None);
        assert_eq!(j["agent_memory"], json!(["doca-host", "gpu-dmabuf"]));
        let ns = &j["namespaces"][0];
        assert_eq!(
            (ns["access"].clone(), ns["data_path"].clone(), ns["transport"].clone(), ns["encryption"].clone()),
            (json!(["read", "list"]), json!("auto"), json!("verbs-rc"), json!("aes-256-gcm"))
        );
        let text = to_text(&caps(), Some("data"));
        assert!(text.contains("region memory:   doca-host, gpu-dmabuf"), "{text}");
        assert!(text.contains("data path:     auto (transport verbs-rc, placement direct)"), "{text}");
        assert!(text.contains("objects up to 80000 MiB"), "{text}");
        assert!(to_text(&caps(), Some("other")).lines().all(|l| !l.starts_with("namespace")));
    }

    #[test]
    fn what_the_store_does_with_checksums_is_shown() {
        use sluice_proto::common::StoreChecksums;
        let mut c = caps();
        assert_eq!(to_json(&c, None)["namespaces"][0]["store_checksums"], "unknown");
        c.namespaces[0].store_checksums = StoreChecksums::Ignored as i32;
        assert_eq!(to_json(&c, None)["namespaces"][0]["store_checksums"], "ignored");
        assert!(
            to_text(&c, None).contains("checksums:     the store ignores them: Content-MD5"),
            "{}",
            to_text(&c, None)
        );
        c.namespaces[0].store_checksums = StoreChecksums::Kept as i32;
        assert_eq!(to_json(&c, None)["namespaces"][0]["store_checksums"], "kept");
    }
}
