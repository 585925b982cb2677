//! Serves the gRPC listeners: on the main runtime, or dealt out to the
//! per-core runtimes (`cores`), where each connection is served start to
//! finish on one thread.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use sluice_proto::agent::agent_server::AgentServer;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream, UnixListenerStream};

use crate::cores::Cores;
use crate::grpc::GrpcService;
use crate::metrics::Metrics;

/// Accepted connections waiting for their core's server, per core: when
/// they are all taken, accepting waits (the kernel's backlog holds the
/// rest), like the TLS handshake slots.
const WAITING_PER_CORE: usize = 64;

pub type ServerResult = Result<(), tonic::transport::Error>;

/// Most calls in flight on one connection. tonic otherwise sets no limit
/// (hyper's own default of 200 does not apply), so one peer could open
/// calls without end; a shim that reaches it waits for a call to end (its
/// HTTP/2 client holds new ones back) and spreads over its connections.
const MAX_CALLS_PER_CONNECTION: u32 = 1024;

/// The gRPC server settings shared by the TCP and Unix listeners: HTTP/2
/// pings find peers that vanished without closing (a partitioned DPU link)
/// so their connections do not linger; their sessions then expire.
fn grpc_server() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .max_concurrent_streams(Some(MAX_CALLS_PER_CONNECTION))
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .tcp_keepalive(Some(Duration::from_secs(30)))
}

/// Serves `conns` until `stop`: framed-GET connections by `svc`'s framed
/// server, the rest by its gRPC server. Its framed connections end as its
/// calls do (their GETs answered), within the same grace.
async fn serve_sorted<C>(
    conns: impl futures::Stream<Item = std::io::Result<C>> + Send + 'static,
    svc: GrpcService,
    stop: impl Future<Output = ()>,
) -> ServerResult
where
    C: crate::framed_gets::Conn + tonic::transport::server::Connected,
{
    let framed = svc.clone();
    let (grpc, framed) = crate::framed_gets::sort(conns, move |c| framed.serve_framed(c));
    let served = grpc_server().add_service(AgentServer::new(svc)).serve_with_incoming_shutdown(grpc, stop).await;
    framed.wait().await;
    served
}

/// Starts the servers of every listener into one set.
pub struct Listeners {
    pub servers: JoinSet<ServerResult>,
    stop: watch::Receiver<bool>,
    cores: Option<Arc<Cores>>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    metrics: Arc<Metrics>,
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    // A dropped sender (the agent's `run` gone) stops too.
    let _ = rx.wait_for(|s| *s).await;
}

impl Listeners {
    pub fn new(
        stop: watch::Receiver<bool>,
        cores: Option<Arc<Cores>>,
        tls: Option<tokio_rustls::TlsAcceptor>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self { servers: JoinSet::new(), stop, cores, tls, metrics }
    }

    /// A TCP listener: mutual TLS, or plaintext when `[tls] insecure`.
    /// `tenant` names the tenant whose own listener it is ("" for none).
    /// Besides gRPC it serves framed GETs (`framed_gets.rs`): chosen by
    /// the TLS handshake, or by a plaintext connection's first byte.
    pub fn tcp(&mut self, l: TcpListener, svc: GrpcService, tenant: &str) {
        let svc = svc.on_tcp();
        let Some(cores) = self.cores.clone() else {
            let stop = stopped(self.stop.clone());
            match &self.tls {
                Some(acceptor) => {
                    let incoming = crate::tls::incoming(l, acceptor.clone(), self.refused(tenant));
                    self.servers.spawn(serve_sorted(incoming, svc, stop));
                }
                None => {
                    let incoming = TcpListenerStream::new(l).map(|c| {
                        let c = c?;
                        c.set_nodelay(true)?;
                        Ok::<_, std::io::Error>(c)
                    });
                    self.servers.spawn(serve_sorted(incoming, svc, stop));
                }
            }
            return;
        };
        // Each core re-registers its sockets with its own runtime.
        let accepted = TcpListenerStream::new(l).map(|c| c.and_then(tokio::net::TcpStream::into_std));
        let queues = self.per_core(
            &cores,
            |rx: ReceiverStream<std::net::TcpStream>, tls, refused, stop| {
                let conns = rx.map(|c| {
                    let c = tokio::net::TcpStream::from_std(c)?;
                    c.set_nodelay(true)?;
                    Ok::<_, std::io::Error>(c)
                });
                let svc = svc.clone();
                // Handshakes and sorting run on the core's own runtime:
                // framed connections are served there, as its gRPC ones are.
                async move {
                    match tls {
                        Some(acceptor) => {
                            serve_sorted(crate::tls::handshakes(conns, acceptor, refused), svc, stop).await
                        }
                        None => serve_sorted(conns, svc, stop).await,
                    }
                }
            },
            tenant,
        );
        self.deal(accepted, queues, cores);
    }

    /// The Unix socket (co-located shims): plaintext, reached only by the
    /// shim's user. Besides gRPC it serves framed GETs
    /// (`framed_gets.rs`), told apart by a connection's first byte.
    pub fn unix(&mut self, l: UnixListener, svc: GrpcService) {
        let Some(cores) = self.cores.clone() else {
            let stop = stopped(self.stop.clone());
            self.servers.spawn(serve_sorted(UnixListenerStream::new(l), svc, stop));
            return;
        };
        let accepted = UnixListenerStream::new(l).map(|c| c.and_then(tokio::net::UnixStream::into_std));
        let queues = self.per_core(
            &cores,
            |rx: ReceiverStream<std::os::unix::net::UnixStream>, _tls, _refused, stop| {
                let conns = rx.map(tokio::net::UnixStream::from_std);
                // Sorted on the core's own runtime: framed connections are
                // served there, as its gRPC ones are.
                serve_sorted(conns, svc.clone(), stop)
            },
            "",
        );
        self.deal(accepted, queues, cores);
    }

    /// Counts a refused TLS handshake against `tenant`'s listener.
    fn refused(&self, tenant: &str) -> impl Fn() + Send + Sync + 'static {
        let (m, tenant) = (self.metrics.clone(), tenant.to_owned());
        move || m.auth_failures.with_label_values(&[&tenant, "tls"]).inc()
    }

    /// Starts one server per core, each fed by a queue of its own; returns
    /// the queues' senders. The set gets one entry that ends when every
    /// core's server has (or at the first that fails).
    fn per_core<C, F, Fut>(&mut self, cores: &Arc<Cores>, serve: F, tenant: &str) -> Vec<mpsc::Sender<C>>
    where
        C: Send + 'static,
        F: Fn(ReceiverStream<C>, Option<tokio_rustls::TlsAcceptor>, Box<dyn Fn() + Send + Sync>, BoxStop) -> Fut,
        Fut: Future<Output = ServerResult> + Send + 'static,
    {
        let mut queues = Vec::with_capacity(cores.len());
        let mut done = Vec::with_capacity(cores.len());
        for i in 0..cores.len() {
            let (tx, rx) = mpsc::channel::<C>(WAITING_PER_CORE);
            queues.push(tx);
            let server = serve(
                ReceiverStream::new(rx),
                self.tls.clone(),
                Box::new(self.refused(tenant)),
                Box::pin(stopped(self.stop.clone())),
            );
            done.push(cores.spawn_on(i, move || server));
        }
        self.servers.spawn(async move {
            // A core whose runtime stopped (its receiver closed) has
            // nothing left to report.
            futures::future::try_join_all(done.into_iter().map(|rx| async move { rx.await.unwrap_or(Ok(())) }))
                .await
                .map(|_| ())
        });
        queues
    }

    /// Deals `accepted` connections round robin to the cores' `queues`
    /// until the agent stops.
    fn deal<C: Send + 'static>(
        &mut self,
        accepted: impl Stream<Item = std::io::Result<C>> + Send + 'static,
        queues: Vec<mpsc::Sender<C>>,
        cores: Arc<Cores>,
    ) {
        let stop = stopped(self.stop.clone());
        tokio::spawn(async move {
            let mut accepted = std::pin::pin!(accepted);
            let mut stop = std::pin::pin!(stop);
            loop {
                match crate::accept::next_conn(&mut accepted, &mut stop, "a control connection").await {
                    Some(conn) => {
                        // The core in turn, or the next with room: one
                        // stalled or full core must not stop accepting for
                        // the others. Only when all are full, wait.
                        let first = cores.pick() % queues.len();
                        let mut conn = Some(conn);
                        for i in 0..queues.len() {
                            let Some(c) = conn.take() else { break };
                            match queues[(first + i) % queues.len()].try_send(c) {
                                Ok(()) => {}
                                Err(mpsc::error::TrySendError::Full(c)) => conn = Some(c),
                                Err(mpsc::error::TrySendError::Closed(_)) => return,
                            }
                        }
                        if let Some(c) = conn {
                            tokio::select! {
                                sent = queues[first].send(c) => if sent.is_err() { return },
                                () = &mut stop => return,
                            }
                        }
                    }
                    None => return,
                }
            }
        });
    }
}

type BoxStop = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;
