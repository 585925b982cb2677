//! moto (the Python AWS mock, `pip install moto[server]`) as a third-party S3
//! store with signature checking on: after the setup calls, every request
//! must be signed with an IAM access key it issued, or it is refused with
//! `SignatureDoesNotMatch`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running moto server with bucket "data", a user whose key may do
/// anything on S3 and assume role `role_arn`, whose temporary credentials
/// (STS) may do the same. Stopped on drop.
pub struct Moto {
    child: Child,
    pub port: u16,
    pub access_key: String,
    pub secret_key: String,
    pub role_arn: String,
    _dir: tempfile::TempDir,
}

/// Temporary credentials from STS AssumeRole.
#[derive(Debug, Clone)]
pub struct TemporaryKeys {
    pub access_key: String,
    pub secret_key: String,
    pub session_token: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn venv_bin(name: &str) -> PathBuf {
    let python = std::env::var("SLUICE_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python"));
    python.with_file_name(name)
}

/// The setup calls, made before authentication starts (their number is
/// moto's INITIAL_NO_AUTH_ACTION_COUNT): a user, its key, its policy, and a
/// role it may assume whose policy allows S3. (moto accepts temporary
/// credentials from AssumeRole only, not from GetSessionToken.)
const SETUP: &str = r#"
import boto3, json, sys
ep = sys.argv[1]
iam = boto3.client("iam", endpoint_url=ep, region_name="us-east-1", aws_access_key_id="setup", aws_secret_access_key="setup")
user = iam.create_user(UserName="sluice")["User"]
key = iam.create_access_key(UserName="sluice")["AccessKey"]
policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["s3:*", "sts:AssumeRole"], "Resource": "*"}]}
iam.put_user_policy(UserName="sluice", PolicyName="s3", PolicyDocument=json.dumps(policy))
trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"AWS": user["Arn"]}, "Action": "sts:AssumeRole"}]}
role = iam.create_role(RoleName="sluice-role", AssumeRolePolicyDocument=json.dumps(trust))["Role"]
s3_only = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
iam.put_role_policy(RoleName="sluice-role", PolicyName="s3", PolicyDocument=json.dumps(s3_only))
s3 = boto3.client("s3", endpoint_url=ep, region_name="us-east-1",
                  aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"])
s3.create_bucket(Bucket="data")
bad = boto3.client("s3", endpoint_url=ep, region_name="us-east-1",
                   aws_access_key_id=key["AccessKeyId"], aws_secret_access_key="not-the-secret")
try:
    bad.list_objects_v2(Bucket="data")
    sys.exit("moto accepted a request signed with the wrong secret: signature checking is off")
except bad.exceptions.ClientError as e:
    assert e.response["Error"]["Code"] == "SignatureDoesNotMatch", e.response["Error"]
print(key["AccessKeyId"], key["SecretAccessKey"], role["Arn"])
"#;

/// AssumeRole, signed with the user's key: prints key, secret and token.
const ASSUME: &str = r#"
import boto3, sys
ep, ak, sk, arn, name = sys.argv[1:6]
sts = boto3.client("sts", endpoint_url=ep, region_name="us-east-1", aws_access_key_id=ak, aws_secret_access_key=sk)
c = sts.assume_role(RoleArn=arn, RoleSessionName=name, DurationSeconds=3600)["Credentials"]
print(c["AccessKeyId"], c["SecretAccessKey"], c["SessionToken"])
"#;

impl Moto {
    /// Fresh temporary credentials for session `name` of the role.
    pub fn assume_role(&self, name: &str) -> TemporaryKeys {
        let out = Command::new(venv_bin("python"))
            .args(["-c", ASSUME, &format!("http://127.0.0.1:{}", self.port)])
            .args([&self.access_key, &self.secret_key, &self.role_arn, name])
            .output()
            .expect("running AssumeRole");
        assert!(out.status.success(), "AssumeRole failed: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let w: Vec<&str> = text.split_whitespace().collect();
        assert_eq!(w.len(), 3, "AssumeRole printed {text:?}");
        TemporaryKeys { access_key: w[0].into(), secret_key: w[1].into(), session_token: w[2].into() }
    }
}

/// Starts moto on a free port and sets it up (fails the test if it cannot).
pub fn start() -> Moto {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("moto.log");
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port();
    let server = venv_bin("moto_server");
    let child = Command::new(&server)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        // The setup makes 5 IAM calls; the bucket is created with the key.
        .env("INITIAL_NO_AUTH_ACTION_COUNT", "5")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).expect("log"))
        .stderr(std::fs::File::create(dir.path().join("moto.err")).expect("log"))
        .spawn()
        .unwrap_or_else(|e| {
            panic!("starting {}: {e} (scripts/test installs moto[server] into .venv)", server.display())
        });
    let mut moto =
        Moto { child, port, access_key: String::new(), secret_key: String::new(), role_arn: String::new(), _dir: dir };
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(30), "moto did not start on port {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = Command::new(venv_bin("python"))
        .args(["-c", SETUP, &format!("http://127.0.0.1:{port}")])
        .output()
        .expect("running the moto setup");
    assert!(out.status.success(), "moto setup failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut words = text.split_whitespace();
    moto.access_key = words.next().expect("access key").to_owned();
    moto.secret_key = words.next().expect("secret key").to_owned();
    moto.role_arn = words.next().expect("role arn").to_owned();
    moto
}
