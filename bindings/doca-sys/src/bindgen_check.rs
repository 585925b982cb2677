//! Built only with `--features bindgen-check` when DOCA headers were found:
//! bindgen's view of the same functions, against which `doca_library!`
//! checks every hand-written signature at compile time. Opaque structs and
//! `union doca_data` are taken from [`crate::types`] (blocklisted in
//! build.rs) so the generated signatures mention the same types.

#[allow(dead_code, non_camel_case_types, non_snake_case, non_upper_case_globals, unused_imports, clippy::all)]
pub(crate) mod generated {
    use crate::types::*;
    include!(concat!(env!("OUT_DIR"), "/doca_bindings.rs"));
}
