//! Ranged GETs: planning from metadata, fetching only the planned bytes, decrypting only those
//! chunks, and slicing must give exactly the requested plaintext.

#![allow(clippy::unwrap_used)]

mod common;

use common::{pattern, provider, BUCKET, C, CU, KEY, TENANT};
use proptest::prelude::*;
use sluice_crypt::{
    ciphertext_len, plaintext_len, plan_range, seal_object, CryptError, Metadata, ObjectOpener, ObjectSealer,
    HEADER_LEN, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE,
};

/// (object size, range start, range length) with a non-empty range inside the object.
fn size_and_range() -> impl Strategy<Value = (usize, u64, u64)> {
    (1..=5 * CU + CU - 1).prop_flat_map(|n| (Just(n), 0..n as u64)).prop_flat_map(|(n, start)| {
        let max_len = n as u64 - start;
        (Just(n), Just(start), 1..=max_len)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn planned_range_decrypts_exactly_the_range((n, start, len) in size_and_range()) {
        let p = provider();
        let plain = pattern(n);
        // PUT: the agent seals and stores the object and its metadata.
        let (header, sealer) = ObjectSealer::new(&p, TENANT, BUCKET, KEY, n as u64, C).unwrap();
        let mut object = header.to_vec();
        for i in 0..sealer.layout().chunk_count() {
            let s = i as usize * CU;
            object.extend(sealer.seal_chunk(i, &plain[s..(s + CU).min(n)]).unwrap());
        }
        let meta = Metadata::from_pairs(sealer.metadata().to_pairs()).unwrap().unwrap();

        // GET with a range: plan from metadata, fetch header + exactly the planned bytes.
        let plan = meta.plan_range(start, len).unwrap();
        prop_assert_eq!(&plan, &plan_range(n as u64, C, start, len).unwrap());
        prop_assert!(plan.ciphertext.start >= HEADER_LEN as u64);
        prop_assert!(plan.ciphertext.end <= object.len() as u64);
        let fetched = &object[plan.ciphertext.start as usize..plan.ciphertext.end as usize];
        let opener = ObjectOpener::new(&p, TENANT, BUCKET, KEY, &object[..HEADER_LEN]).unwrap();
        opener.check_metadata(&meta).unwrap();
        let want = &plain[start as usize..(start + len) as usize];

        // Chunk by chunk, as the agent would do it in parallel.
        let mut out = Vec::new();
        let mut offset = 0usize;
        for index in plan.chunks() {
            let r = opener.layout().chunk_ciphertext_range(index).unwrap();
            let size = (r.end - r.start) as usize;
            let mut buf = fetched[offset..offset + size].to_vec();
            out.extend_from_slice(opener.open_chunk(index, &mut buf).unwrap());
            offset += size;
        }
        prop_assert_eq!(offset, fetched.len(), "the plan fetches no extra bytes");
        let sliced = &out[plan.skip..plan.skip + plan.take() as usize];
        prop_assert_eq!(sliced, want);
        // The plan covers no chunk it does not need.
        prop_assert!(plan.skip < CU);
        prop_assert!(out.len() - plan.skip - (len as usize) < CU);

        // The same through the in-place helper.
        let mut buf = fetched.to_vec();
        prop_assert_eq!(opener.open_range(&plan, &mut buf).unwrap(), want);
    }

    #[test]
    fn lengths_invert(n in 0u64..1 << 40, shift in 12u32..=24) {
        let c = 1u32 << shift;
        let l = ciphertext_len(n, c).unwrap();
        prop_assert_eq!(plaintext_len(l, c).unwrap(), n);
        // Lengths that no object can have are refused rather than misread.
        for delta in 1..=16u64 {
            if let Ok(m) = plaintext_len(l + delta, c) {
                prop_assert_eq!(ciphertext_len(m, c).unwrap(), l + delta);
                prop_assert!(m > n);
            }
        }
    }
}

#[test]
fn chunk_size_bounds_are_inclusive() {
    assert!(plan_range(10, MIN_CHUNK_SIZE, 0, 10).is_ok());
    assert!(plan_range(10, MAX_CHUNK_SIZE, 0, 10).is_ok());
    assert!(matches!(plan_range(10, MIN_CHUNK_SIZE / 2, 0, 10), Err(CryptError::InvalidChunkSize(_))));
    assert!(matches!(plan_range(10, MAX_CHUNK_SIZE * 2, 0, 10), Err(CryptError::InvalidChunkSize(_))));
}

#[test]
fn empty_object_has_no_ranges() {
    assert!(matches!(plan_range(0, C, 0, 1), Err(CryptError::RangeOutOfBounds { start: 0, len: 1, size: 0 })));
}

#[test]
fn range_in_first_chunk_is_contiguous_with_the_header() {
    let p = provider();
    let plain = pattern(3 * CU);
    let object = seal_object(&p, TENANT, BUCKET, KEY, &plain, C).unwrap();
    let plan = plan_range(plain.len() as u64, C, 10, 20).unwrap();
    assert_eq!(plan.ciphertext.start, HEADER_LEN as u64);
    assert_eq!((plan.first_chunk, plan.chunk_count, plan.skip), (0, 1, 10));
    let mut buf = object[plan.ciphertext.start as usize..plan.ciphertext.end as usize].to_vec();
    let opener = ObjectOpener::new(&p, TENANT, BUCKET, KEY, &object[..HEADER_LEN]).unwrap();
    assert_eq!(opener.open_range(&plan, &mut buf).unwrap(), &plain[10..30]);
    // A ranged fetch that is one byte short is a truncation.
    let mut short = object[plan.ciphertext.start as usize..plan.ciphertext.end as usize - 1].to_vec();
    assert!(matches!(opener.open_range(&plan, &mut short), Err(CryptError::Integrity)));
}
