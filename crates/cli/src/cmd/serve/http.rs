//! `serve`'s HTTP side: who may connect, and the answer to each request. Read-only: GET or
//! HEAD of `/metrics` (and `/`, a pointer to it); anything else gets a 4xx, never a crash.

use std::net::{SocketAddr, ToSocketAddrs};

use tiny_http::{Header, Method, Request, Response, Server, SslConfig};
use virtprof_agent::serve::constant_time_eq;

use super::Collector;
use crate::args::ServeArgs;
use crate::exit::usage;
use crate::watch::metrics::Format;

/// Largest certificate or key file read.
const PEM_LIMIT: u64 = 1 << 20;

/// Where and how `serve` listens.
pub struct Config {
    pub listen: SocketAddr,
    /// The bearer token clients must send.
    pub token: Option<String>,
    /// PEM certificate chain and key.
    pub tls: Option<(Vec<u8>, Vec<u8>)>,
}

impl Config {
    /// Check the options: an address other hosts can reach needs a token.
    pub fn from_args(args: &ServeArgs) -> anyhow::Result<Config> {
        let listen = args.listen.to_socket_addrs().ok().and_then(|mut a| a.next()).ok_or_else(|| {
            usage(format!("--listen '{}': not an address (HOST:PORT, e.g. 127.0.0.1:9477)", args.listen))
        })?;
        let token = args.token_file.as_deref().map(crate::cmd::agent::read_token).transpose()?;
        if !listen.ip().is_loopback() && token.is_none() {
            return Err(usage(format!(
                "--listen {listen}: other hosts can reach this address; give --token-file FILE \
                 (and --tls-cert/--tls-key), or listen on 127.0.0.1"
            )));
        }
        let pem = |path: &std::path::Path, what: &str| {
            virtprof_host::input::read_bytes(path, what, PEM_LIMIT).map_err(|e| usage(e.to_string()))
        };
        let tls = match (&args.tls_cert, &args.tls_key) {
            (Some(cert), Some(key)) => Some((pem(cert, "TLS certificate")?, pem(key, "TLS key")?)),
            _ => None,
        };
        if tls.is_none() && token.is_some() && !listen.ip().is_loopback() {
            eprintln!("virtprof: the bearer token travels in clear over plain HTTP; add --tls-cert/--tls-key");
        }
        Ok(Config { listen, token, tls })
    }
}

/// Listen as configured.
pub fn bind(config: &Config) -> anyhow::Result<Server> {
    let server = match &config.tls {
        Some((certificate, private_key)) => Server::https(
            config.listen,
            SslConfig { certificate: certificate.clone(), private_key: private_key.clone() },
        ),
        None => Server::http(config.listen),
    };
    server.map_err(|e| {
        let hint =
            if config.tls.is_some() { " (are --tls-cert and --tls-key a PEM certificate and its key?)" } else { "" };
        usage(format!("cannot listen on {}: {e}{hint}", config.listen))
    })
}

/// Answer one request. A client that goes away mid-answer costs nothing.
pub fn answer(request: Request, config: &Config, collector: &mut Collector) {
    let text = |code: u16, body: &str| {
        Response::from_string(body)
            .with_status_code(code)
            .with_header(header("Content-Type", "text/plain; charset=utf-8"))
    };
    if !matches!(request.method(), Method::Get | Method::Head) {
        let response =
            text(405, "virtprof serve is read-only: GET /metrics\n").with_header(header("Allow", "GET, HEAD"));
        let _ = request.respond(response);
        return;
    }
    if let Some(token) = &config.token {
        let sent = request
            .headers()
            .iter()
            .find(|h| h.field.equiv("Authorization"))
            .and_then(|h| h.value.as_str().strip_prefix("Bearer "));
        if !sent.is_some_and(|s| constant_time_eq(s.trim().as_bytes(), token.as_bytes())) {
            let response = text(401, "a bearer token is required (Authorization: Bearer TOKEN)\n")
                .with_header(header("WWW-Authenticate", "Bearer realm=\"virtprof\""));
            let _ = request.respond(response);
            return;
        }
    }
    let path = request.url().split('?').next().unwrap_or("");
    let response = match path {
        "/metrics" => {
            let accept =
                request.headers().iter().find(|h| h.field.equiv("Accept")).map(|h| h.value.as_str().to_string());
            let format = Format::from_accept(accept.as_deref());
            match collector.scrape(format) {
                Ok(body) => Response::from_string(body).with_header(header("Content-Type", format.content_type())),
                Err(e) => {
                    eprintln!("virtprof: scrape failed: {e:#}");
                    text(500, &format!("scrape failed: {e:#}\n"))
                }
            }
        }
        "/" => text(200, "virtprof serve: metrics at /metrics\n"),
        _ => text(404, "not found: virtprof serves /metrics\n"),
    };
    let _ = request.respond(response);
}

fn header(name: &str, value: &str) -> Header {
    // Both are ASCII constants or our own content types.
    Header::from_bytes(name.as_bytes(), value.as_bytes()).expect("ASCII header")
}
