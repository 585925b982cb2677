//! The upstream backend: the gateway fronts another S3 endpoint (any
//! community store), verifying its own clients and re-signing towards the
//! upstream with its own credentials. RDMA requests are served by moving the
//! upstream's bytes one-sidedly, so that store gains an RDMA data path.

use crate::GatewayError;

#[cfg(feature = "upstream")]
pub fn proxy(endpoint: &str, region: &str, access_key: &str, secret_key: &str) -> Result<s3s_aws::Proxy, GatewayError> {
    use aws_sdk_s3::config::{
        BehaviorVersion, Credentials, Region, RequestChecksumCalculation, ResponseChecksumValidation,
    };
    if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
        return Err(GatewayError::Invalid(format!("backend endpoint {endpoint:?} must be an http(s) URL")));
    }
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(Region::new(region.to_owned()))
        .credentials_provider(Credentials::new(access_key, secret_key, None, None, "sluice-gateway"))
        .force_path_style(true)
        // Bodies stream through (RDMA READs): no SDK-computed checksums that
        // would need a rewindable body or aws-chunked trailers upstream.
        .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
        .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
        .build();
    Ok(s3s_aws::Proxy::from(aws_sdk_s3::Client::from_conf(conf)))
}

/// Built without the `upstream` feature: say so instead of pretending.
#[cfg(not(feature = "upstream"))]
pub fn proxy(_: &str, _: &str, _: &str, _: &str) -> Result<crate::store::Store, GatewayError> {
    Err(GatewayError::Invalid("this gateway was built without the `upstream` feature; rebuild with it".into()))
}
