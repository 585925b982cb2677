//! S3 credentials rotate on SIGHUP without dropping transfers: the agent
//! re-reads its config (and secret files), every namespace signs from then
//! on with the new keys, and requests in flight carry on.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sluice_tests::{pattern, sha256, Options, Stack, ACCESS_KEY, SECRET_KEY};

const NEW_KEY: &str = "rotated-access";
const NEW_SECRET: &str = "rotated-secret-key-9876543210";

#[tokio::test]
async fn credentials_rotate_under_load_without_dropping_transfers() {
    // The store accepts both keys while the agent moves from one to the other.
    let both = format!("[[credentials]]\naccess_key = \"{NEW_KEY}\"\nsecret_key = \"{NEW_SECRET}\"\n");
    let mut stack = Stack::with(Options { gateway_extra: both, ..Default::default() });
    let c = Arc::new(stack.client().await);
    let data = pattern((4 << 20) + 3, 21);
    let r = Arc::new(c.register(data.len() as u64).await.unwrap());
    r.write_at(0, &data).unwrap();
    c.put("data/rotate.bin", &r, 0, data.len() as u64).await.unwrap();

    // Readers keep going through the rotation; every read must be whole.
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU32::new(0));
    let mut readers = Vec::new();
    for _ in 0..2 {
        let (c, stop, reads, want) = (c.clone(), stop.clone(), reads.clone(), sha256(&data));
        readers.push(tokio::spawn(async move {
            let r = c.register((4 << 20) + 3).await.unwrap();
            while !stop.load(Ordering::Relaxed) {
                let t = c.get("data/rotate.bin", &r, 0, None).await.unwrap();
                assert_eq!(t.bytes, (4 << 20) + 3);
                assert_eq!(sha256(r.as_slice()), want);
                reads.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = reads.load(Ordering::Relaxed);
    let path = stack.dir.path().join("agent.toml");
    let config = std::fs::read_to_string(&path).unwrap();
    let old = format!("[credentials.main]\naccess_key = \"{ACCESS_KEY}\"\nsecret_key = \"{SECRET_KEY}\"");
    assert!(config.contains(&old), "the harness's agent config changed shape");
    // The new secret from a file, as in production.
    private(&stack.dir.path().join("main.secret"), format!("{NEW_SECRET}\n").as_bytes());
    let new = format!("[credentials.main]\naccess_key = \"{NEW_KEY}\"\nsecret_key_file = \"main.secret\"");
    std::fs::write(&path, config.replace(&old, &new)).unwrap();
    stack.signal("sluice-agent", "HUP");
    let t0 = std::time::Instant::now();
    while !stack.log("sluice-agent").contains("SIGHUP: credentials rotated") {
        assert!(t0.elapsed() < Duration::from_secs(10), "no rotation logged:\n{}", stack.log("sluice-agent"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for t in readers {
        t.await.unwrap();
    }
    let after = reads.load(Ordering::Relaxed);
    assert!(before > 0 && after > before, "reads went on through the rotation ({before} then {after})");
    assert!(stack.log("sluice-agent").contains(NEW_KEY), "the log names the new access key");
    assert!(!stack.log("sluice-agent").contains(NEW_SECRET), "never the secret");

    // The store now forgets the old key: the agent's requests still work,
    // so they are signed with the new one.
    let gw = stack.dir.path().join("gateway.toml");
    let gw_config = std::fs::read_to_string(&gw).unwrap();
    let old_gw = format!("[[credentials]]\naccess_key = \"{ACCESS_KEY}\"\nsecret_key = \"{SECRET_KEY}\"\n");
    assert!(gw_config.contains(&old_gw));
    std::fs::write(&gw, gw_config.replace(&old_gw, "")).unwrap();
    stack.restart("sluice-gateway");
    r.write_at(0, &vec![0; data.len()]).unwrap();
    c.get("data/rotate.bin", &r, 0, None).await.unwrap();
    assert_eq!(sha256(r.as_slice()), sha256(&data));
}

#[tokio::test]
async fn an_unreadable_new_secret_keeps_the_old_keys() {
    let stack = Stack::start();
    let c = stack.client().await;
    let path = stack.dir.path().join("agent.toml");
    let config = std::fs::read_to_string(&path).unwrap();
    let old = format!("[credentials.main]\naccess_key = \"{ACCESS_KEY}\"\nsecret_key = \"{SECRET_KEY}\"");
    let new = format!("[credentials.main]\naccess_key = \"{NEW_KEY}\"\nsecret_key_file = \"missing.secret\"");
    std::fs::write(&path, config.replace(&old, &new)).unwrap();
    stack.signal("sluice-agent", "HUP");
    let t0 = std::time::Instant::now();
    let refused = |log: String| log.contains("kept the old keys") || log.contains("SIGHUP: config not re-read");
    while !refused(stack.log("sluice-agent")) {
        assert!(t0.elapsed() < Duration::from_secs(10), "{}", stack.log("sluice-agent"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Still signing with the keys the store knows.
    let r = c.register(10).await.unwrap();
    r.write_at(0, b"still here").unwrap();
    c.put("data/kept", &r, 0, 10).await.unwrap();
}

/// A reload that points a namespace at other credentials is reported as
/// not done (its signer was made for the first ones, and is not switched):
/// a revocation by renaming must not look done.
#[tokio::test]
async fn a_namespace_moved_to_other_credentials_is_reported_not_switched() {
    let stack = Stack::start();
    let c = stack.client().await;
    let path = stack.dir.path().join("agent.toml");
    let config = std::fs::read_to_string(&path).unwrap();
    assert!(config.contains("credentials = \"main\""), "{config}");
    let moved = config.replace("credentials = \"main\"", "credentials = \"other\"")
        + "\n[credentials.other]\naccess_key = \"other-key\"\nsecret_key = \"other-secret-0123456789\"\n";
    std::fs::write(&path, moved).unwrap();
    stack.signal("sluice-agent", "HUP");
    let t0 = std::time::Instant::now();
    while !stack.log("sluice-agent").contains("SIGHUP: reload done") {
        assert!(t0.elapsed() < Duration::from_secs(10), "{}", stack.log("sluice-agent"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let log = stack.log("sluice-agent");
    assert!(log.contains("now names credentials \"other\"") && log.contains("needs a restart"), "{log}");
    let r = c.register(10).await.unwrap();
    r.write_at(0, b"still main").unwrap();
    c.put("data/still-main", &r, 0, 10).await.expect("still signing with the first credentials");
}

/// Temporary credentials (STS): the agent signs with the session token
/// (`x-amz-security-token`), reads keys and token again on SIGHUP, and a
/// store that issued them (moto, signature checks on) accepts them. The
/// same keys without their token are refused: the token is what is sent.
#[tokio::test]
async fn temporary_credentials_with_a_session_token_rotate_on_sighup() {
    let moto = sluice_tests::moto::start();
    let first = moto.assume_role("sluice-1");
    assert!(first.access_key.starts_with("ASIA"), "temporary keys: {first:?}");
    let addr = format!("127.0.0.1:{}", moto.port);
    let stack = Stack::with(Options {
        endpoints: vec![format!("http://{addr}")],
        agent_credentials: (moto.access_key.clone(), moto.secret_key.clone()),
        gateway: false,
        ..Default::default()
    });
    let c = stack.client().await;
    let data = pattern((6 << 20) + 5, 31); // multipart: 2 parts
    let r = c.register(data.len() as u64).await.unwrap();
    r.write_at(0, &data).unwrap();

    let path = stack.dir.path().join("agent.toml");
    let config = std::fs::read_to_string(&path).unwrap();
    let long_term =
        format!("[credentials.main]\naccess_key = \"{}\"\nsecret_key = \"{}\"", moto.access_key, moto.secret_key);
    assert!(config.contains(&long_term), "the harness's agent config changed shape");
    let use_keys = |keys: &sluice_tests::moto::TemporaryKeys, token_file: Option<&str>| {
        private(&stack.dir.path().join("sts.secret"), keys.secret_key.as_bytes());
        let mut table =
            format!("[credentials.main]\naccess_key = \"{}\"\nsecret_key_file = \"sts.secret\"", keys.access_key);
        if let Some(f) = token_file {
            private(&stack.dir.path().join(f), format!("{}\n", keys.session_token).as_bytes());
            table.push_str(&format!("\nsession_token_file = \"{f}\""));
        }
        std::fs::write(&path, config.replace(&long_term, &table)).unwrap();
        stack.signal("sluice-agent", "HUP");
    };
    // The rotation's log line names the access key, and a token if any.
    let wait = |line: String| {
        let stack = &stack;
        async move {
            let t0 = std::time::Instant::now();
            while !stack.log("sluice-agent").contains(&line) {
                assert!(t0.elapsed() < Duration::from_secs(10), "no {line:?} in:\n{}", stack.log("sluice-agent"));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };

    // 1. The temporary keys with their token: every kind of request works.
    use_keys(&first, Some("sts.token"));
    wait(format!("as {} with a session token now", first.access_key)).await;
    c.put("data/sts.bin", &r, 0, data.len() as u64).await.unwrap();
    r.write_at(0, &vec![0; data.len()]).unwrap();
    c.get("data/sts.bin", &r, 0, None).await.unwrap();
    assert_eq!(sha256(r.as_slice()), sha256(&data));
    assert_eq!(c.head("data/sts.bin").await.unwrap().size, data.len() as u64);
    assert!(!stack.log("sluice-agent").contains(&first.session_token), "never the token in the log");

    // 2. The same keys without the token: the store does not know them.
    use_keys(&first, None);
    wait(format!("as {} now", first.access_key)).await;
    let e = c.head("data/sts.bin").await.unwrap_err();
    assert_eq!(e.code(), Some(sluice_client::Code::AccessDenied), "{e}");

    // 3. Fresh temporary credentials (a refresh): written, SIGHUP, in use.
    let second = moto.assume_role("sluice-2");
    assert_ne!(second.session_token, first.session_token);
    use_keys(&second, Some("sts2.token"));
    wait(format!("as {} with a session token now", second.access_key)).await;
    c.get("data/sts.bin", &r, 0, None).await.unwrap();
    assert_eq!(sha256(r.as_slice()), sha256(&data));
}

/// A credentials file as an operator makes one: readable by its owner only
/// (the agent refuses others).
fn private(path: &std::path::Path, data: &[u8]) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, data).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}
