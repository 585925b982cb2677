//! The gateway's S3 front: wraps any `s3s` backend (the local directory
//! store or an upstream S3 endpoint). GetObject, PutObject and UploadPart
//! that carry `x-amz-rdma-token` are served over the one-sided data path
//! (`token_path.rs`); a local store's GET reads the very file it opened. Every
//! other request passes to the backend, and the backend's internal errors
//! are named on the way out (`backend_errors.rs`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use http::StatusCode;
use s3s::dto::*;
use s3s::{S3Request, S3Response, S3Result, S3};
use sluice_dataplane::tcp::TcpRemote;
use sluice_dataplane::verbs::VerbsRemote;

use crate::backend_errors::explain_internal;
use crate::store::DirStore;
use crate::token_path::RdmaStats;

/// The S3 front around the backend `S`.
pub struct Front<S> {
    pub(crate) inner: S,
    pub(crate) tcp: Option<TcpRemote>,
    pub(crate) verbs: Option<VerbsRemote>,
    /// Standard (mlx5 DC) tokens, when a DC-capable device is configured.
    pub(crate) dc: Option<VerbsRemote>,
    /// When the backend is the local directory store: the store, so that a
    /// GET reads the very file whose ETag it reports (`sendfile` for RDMA
    /// WRITEs).
    pub(crate) local: Option<Arc<DirStore>>,
    /// Where token owners may be (see `RdmaConfig::allowed_clients`).
    pub(crate) allowed: Vec<ipnet::IpNet>,
    /// Deadline of one one-sided transfer.
    pub(crate) deadline: std::time::Duration,
    pub stats: Arc<RdmaStats>,
}

impl<S: S3> Front<S> {
    /// `tcp`: serve Sluice's `tcp` software transport, with operations of at
    /// most `max_op` bytes. Standard (mlx5 DC) tokens are declined with 501
    /// unless [`Front::with_dc`] gives a DC initiator.
    pub fn new(inner: S, tcp: bool, max_op: u64, local: Option<Arc<DirStore>>) -> Self {
        let tcp = tcp.then(|| TcpRemote::new(max_op));
        let allowed = vec!["127.0.0.0/8".parse().expect("net"), "::1/128".parse().expect("net")];
        let deadline = std::time::Duration::from_secs(60);
        Self { inner, tcp, verbs: None, dc: None, local, allowed, deadline, stats: Arc::default() }
    }

    /// Owner networks tokens may name, and the deadline of one transfer.
    pub fn with_limits(mut self, allowed: Vec<ipnet::IpNet>, deadline: std::time::Duration) -> Self {
        self.allowed = allowed;
        self.deadline = deadline;
        self
    }

    /// Also serve the verbs RC transport (needs an RDMA device).
    pub fn with_verbs(mut self) -> Self {
        self.verbs = Some(VerbsRemote::new());
        self
    }

    /// Also serve standard tokens through mlx5 DC.
    pub fn with_dc(mut self, dc: VerbsRemote) -> Self {
        self.dc = Some(dc);
        self
    }
}

type Fut<'a, T> = Pin<Box<dyn Future<Output = S3Result<S3Response<T>>> + Send + 'a>>;

macro_rules! delegate {
    ($($name:ident: $input:ty => $output:ty;)*) => {
        $(
            fn $name<'life0, 'async_trait>(&'life0 self, req: S3Request<$input>) -> Fut<'async_trait, $output>
            where 'life0: 'async_trait, Self: 'async_trait {
                Box::pin(async move { self.inner.$name(req).await.map_err(explain_internal) })
            }
        )*
    };
}

#[async_trait::async_trait]
impl<S: S3> S3 for Front<S> {
    async fn get_object(&self, req: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
        let ask = self.rdma_ask(&req.headers, &req.uri)?;
        let Some(ask) = ask else { return self.inner.get_object(req).await.map_err(explain_internal) };
        match &self.local {
            // The local store: WRITE straight from the file it opened.
            Some(store) => {
                let o = crate::store::open_for_get(store, &req.input).await?;
                let out = crate::store::get_output(&o, req.input.checksum_mode.as_ref());
                let mut resp = S3Response::new(out);
                if o.ranged {
                    resp.status = Some(StatusCode::PARTIAL_CONTENT);
                }
                self.rdma_get(resp, Some((o.file, o.span.start, o.span.end - o.span.start)), ask).await
            }
            None => {
                let resp = self.inner.get_object(req).await.map_err(explain_internal)?;
                self.rdma_get(resp, None, ask).await
            }
        }
    }

    async fn put_object(&self, mut req: S3Request<PutObjectInput>) -> S3Result<S3Response<PutObjectOutput>> {
        let Some(ask) = self.rdma_ask(&req.headers, &req.uri)? else {
            return self.inner.put_object(req).await.map_err(explain_internal);
        };
        // The checksum is checked as the bytes stream; the backend need not hash again.
        let (body, flags, len) =
            self.rdma_put_body(&ask, req.input.content_length, req.input.checksum_crc64nvme.take())?;
        req.input.body = Some(body);
        req.input.content_length = Some(len as i64);
        let res = self.inner.put_object(req).await;
        self.finish_put(res, &flags, len)
    }

    async fn upload_part(&self, mut req: S3Request<UploadPartInput>) -> S3Result<S3Response<UploadPartOutput>> {
        let Some(ask) = self.rdma_ask(&req.headers, &req.uri)? else {
            return self.inner.upload_part(req).await.map_err(explain_internal);
        };
        // The checksum is checked as the bytes stream; the backend need not hash again.
        let (body, flags, len) =
            self.rdma_put_body(&ask, req.input.content_length, req.input.checksum_crc64nvme.take())?;
        req.input.body = Some(body);
        req.input.content_length = Some(len as i64);
        let res = self.inner.upload_part(req).await;
        self.finish_put(res, &flags, len)
    }

    delegate! {
        abort_multipart_upload: AbortMultipartUploadInput => AbortMultipartUploadOutput;
        complete_multipart_upload: CompleteMultipartUploadInput => CompleteMultipartUploadOutput;
        copy_object: CopyObjectInput => CopyObjectOutput;
        create_bucket: CreateBucketInput => CreateBucketOutput;
        create_multipart_upload: CreateMultipartUploadInput => CreateMultipartUploadOutput;
        delete_bucket: DeleteBucketInput => DeleteBucketOutput;
        delete_object: DeleteObjectInput => DeleteObjectOutput;
        delete_objects: DeleteObjectsInput => DeleteObjectsOutput;
        get_bucket_location: GetBucketLocationInput => GetBucketLocationOutput;
        head_bucket: HeadBucketInput => HeadBucketOutput;
        head_object: HeadObjectInput => HeadObjectOutput;
        list_buckets: ListBucketsInput => ListBucketsOutput;
        list_objects: ListObjectsInput => ListObjectsOutput;
        list_objects_v2: ListObjectsV2Input => ListObjectsV2Output;
        list_parts: ListPartsInput => ListPartsOutput;
        list_multipart_uploads: ListMultipartUploadsInput => ListMultipartUploadsOutput;
        upload_part_copy: UploadPartCopyInput => UploadPartCopyOutput;
    }
}
