//! Sealing and opening objects of every interesting size, whole and chunk by chunk.

#![allow(clippy::unwrap_used)]

mod common;

use common::{pattern, provider, BUCKET, C, CU, KEY, TENANT};
use sluice_crypt::{
    ciphertext_len, open_object, plaintext_len, seal_object, CryptError, Metadata, ObjectOpener, ObjectSealer,
    HEADER_LEN, TAG_LEN,
};

const SIZES: [usize; 8] = [0, 1, CU - 1, CU, CU + 1, 2 * CU, 3 * CU + 100, 7 * CU + 4095];

#[test]
fn round_trip_sizes() {
    let p = provider();
    for n in SIZES {
        let plain = pattern(n);
        let sealed = seal_object(&p, TENANT, BUCKET, KEY, &plain, C).unwrap();
        assert_eq!(sealed.len() as u64, ciphertext_len(n as u64, C).unwrap(), "n={n}");
        assert_eq!(plaintext_len(sealed.len() as u64, C).unwrap(), n as u64);
        assert_eq!(&sealed[..4], b"SLCE");
        if n >= 16 {
            assert_ne!(&sealed[HEADER_LEN..HEADER_LEN + 16], &plain[..16], "chunk 0 is not encrypted");
        }
        assert_eq!(open_object(&p, TENANT, BUCKET, KEY, &sealed).unwrap(), plain, "n={n}");
    }
}

#[test]
fn empty_object_is_one_bare_tag() {
    let p = provider();
    let sealed = seal_object(&p, TENANT, BUCKET, KEY, &[], C).unwrap();
    assert_eq!(sealed.len(), HEADER_LEN + TAG_LEN);
    let opener = ObjectOpener::new(&p, TENANT, BUCKET, KEY, &sealed[..HEADER_LEN]).unwrap();
    assert_eq!(opener.layout().chunk_count(), 1);
    let mut chunk = sealed[HEADER_LEN..].to_vec();
    assert!(opener.open_chunk(0, &mut chunk).unwrap().is_empty());
    assert!(open_object(&p, TENANT, BUCKET, KEY, &sealed).unwrap().is_empty());
}

#[test]
fn sealing_is_randomised_per_object() {
    let p = provider();
    let plain = pattern(CU + 10);
    let a = seal_object(&p, TENANT, BUCKET, KEY, &plain, C).unwrap();
    let b = seal_object(&p, TENANT, BUCKET, KEY, &plain, C).unwrap();
    // Nonce prefix, wrap nonce and wrapped key are fresh; so is every chunk.
    assert_ne!(a[20..28], b[20..28]);
    assert_ne!(a[72..HEADER_LEN], b[72..HEADER_LEN]);
    assert_ne!(a[HEADER_LEN..], b[HEADER_LEN..]);
}

#[test]
fn chunks_seal_and_open_in_parallel_in_any_order() {
    let p = provider();
    let n = 6 * CU + 333;
    let plain = pattern(n);
    let (header, sealer) = ObjectSealer::new(&p, TENANT, BUCKET, KEY, n as u64, C).unwrap();
    let count = sealer.layout().chunk_count();
    assert_eq!(count, 7);
    let mut sealed: Vec<Vec<u8>> = vec![Vec::new(); count as usize];
    std::thread::scope(|s| {
        // Reverse order across threads: chunks carry no state between them.
        for (i, slot) in sealed.iter_mut().enumerate().rev() {
            let (sealer, plain) = (&sealer, &plain);
            s.spawn(move || {
                let part = &plain[i * CU..((i + 1) * CU).min(n)];
                *slot = sealer.seal_chunk(i as u32, part).unwrap();
            });
        }
    });
    let mut object = header.to_vec();
    sealed.iter().for_each(|c| object.extend_from_slice(c));
    assert_eq!(open_object(&p, TENANT, BUCKET, KEY, &object).unwrap(), plain);

    let opener = ObjectOpener::new(&p, TENANT, BUCKET, KEY, &header).unwrap();
    let mut opened: Vec<Vec<u8>> = vec![Vec::new(); count as usize];
    std::thread::scope(|s| {
        for (i, (slot, chunk)) in opened.iter_mut().zip(sealed.iter()).enumerate() {
            let opener = &opener;
            s.spawn(move || {
                let mut buf = chunk.clone();
                *slot = opener.open_chunk(i as u32, &mut buf).unwrap().to_vec();
            });
        }
    });
    assert_eq!(opened.concat(), plain);
}

#[test]
fn in_place_variants_agree() {
    let p = provider();
    let plain = pattern(2 * CU - 7);
    let (_, sealer) = ObjectSealer::new(&p, TENANT, BUCKET, KEY, plain.len() as u64, C).unwrap();
    let by_copy = sealer.seal_chunk(1, &plain[CU..]).unwrap();
    let mut grown = plain[CU..].to_vec();
    sealer.seal_in_place(1, &mut grown).unwrap();
    let mut fixed = plain[CU..].to_vec();
    let tag = sealer.seal_in_place_detached(1, &mut fixed).unwrap();
    fixed.extend_from_slice(&tag);
    assert_eq!(by_copy, grown);
    assert_eq!(by_copy, fixed);
    assert_eq!(by_copy.len(), CU - 7 + TAG_LEN);
}

#[test]
fn sealer_rejects_wrong_chunk_shapes() {
    let p = provider();
    let (_, sealer) = ObjectSealer::new(&p, TENANT, BUCKET, KEY, (CU + 5) as u64, C).unwrap();
    let err = sealer.seal_chunk(0, &[0; 5]).unwrap_err();
    assert!(matches!(err, CryptError::ChunkLength { index: 0, expected, got: 5 } if expected == u64::from(C)));
    assert!(matches!(sealer.seal_chunk(1, &[0; 6]), Err(CryptError::ChunkLength { .. })));
    assert!(matches!(sealer.seal_chunk(2, &[0; 5]), Err(CryptError::ChunkIndex { index: 2, count: 2 })));
    for bad in [0, 1000, 4095, 6144, 32 << 20] {
        let err = ObjectSealer::new(&p, TENANT, BUCKET, KEY, 10, bad).err().unwrap();
        assert!(matches!(err, CryptError::InvalidChunkSize(c) if c == u64::from(bad)), "{bad}");
    }
    let err = ObjectSealer::new(&p, TENANT, BUCKET, KEY, u64::MAX, C).err().unwrap();
    assert!(matches!(err, CryptError::TooLarge { .. }));
    assert!(matches!(ObjectSealer::new(&p, "nobody", BUCKET, KEY, 1, C), Err(CryptError::NoCurrentKey { .. })));
    assert!(matches!(ObjectSealer::new(&p, "../x", BUCKET, KEY, 1, C), Err(CryptError::InvalidName { .. })));
}

#[test]
fn metadata_describes_the_object() {
    let p = provider();
    let n = 3 * CU + 9;
    let plain = pattern(n);
    let (header, sealer) = ObjectSealer::new(&p, TENANT, BUCKET, KEY, n as u64, C).unwrap();
    let pairs = sealer.metadata().to_pairs();
    let as_strings: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    assert_eq!(
        as_strings,
        [("sluice-enc", "v1"), ("sluice-plain-size", "12297"), ("sluice-chunk", "4096"), ("sluice-key-id", "k1")]
    );
    let meta = Metadata::from_pairs(pairs.clone()).unwrap().unwrap();
    assert_eq!(meta.ciphertext_len().unwrap(), ciphertext_len(n as u64, C).unwrap());
    assert_eq!(meta.header_len(), HEADER_LEN);

    let mut object = header.to_vec();
    for i in 0..sealer.layout().chunk_count() {
        let start = i as usize * CU;
        object.extend(sealer.seal_chunk(i, &plain[start..(start + CU).min(n)]).unwrap());
    }
    let opener = ObjectOpener::new(&p, TENANT, BUCKET, KEY, &header).unwrap();
    opener.check_metadata(&meta).unwrap();
    assert_eq!(opener.metadata(), meta);

    // Metadata is not authenticated: a lie about the size is caught against the header.
    let mut lying = meta.clone();
    lying.plaintext_len -= 1;
    assert!(matches!(opener.check_metadata(&lying), Err(CryptError::Integrity)));
    // A plan from lying metadata is refused unless it matches what the header implies.
    let plan = lying.plan_range(0, 100).unwrap();
    let mut buf = object[plan.ciphertext.start as usize..plan.ciphertext.end as usize].to_vec();
    assert_eq!(opener.open_range(&plan, &mut buf).unwrap(), &plain[..100]);
    let plan = lying.plan_range(n as u64 - 11, 10).unwrap();
    let mut buf = object[plan.ciphertext.start as usize..plan.ciphertext.end as usize].to_vec();
    assert!(matches!(opener.open_range(&plan, &mut buf), Err(CryptError::Integrity)));
    let bigger = Metadata { plaintext_len: n as u64 + 50, ..meta };
    let plan = bigger.plan_range(n as u64, 10).unwrap();
    assert!(matches!(opener.open_range(&plan, &mut []), Err(CryptError::Integrity)));
}
