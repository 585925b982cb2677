//! What every Sluice daemon sets up the same way: logging to stderr and the
//! signals that stop it.

/// Logs to stderr: `RUST_LOG` if set, else `default_filter` (e.g. "info");
/// JSON lines with `json`, colours only on a terminal (log files and
/// journald get plain text).
pub fn init_logging(json: bool, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let b = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    if json {
        b.json().init();
    } else {
        b.init();
    }
}

/// Resolves on SIGTERM (systemd's stop) or SIGINT (Ctrl-C). If SIGTERM
/// cannot be watched, Ctrl-C still stops the daemon.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
