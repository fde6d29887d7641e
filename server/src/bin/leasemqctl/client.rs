//! The management API's client: one HTTP/1.1 request a connection, over hyper, plain or
//! TLS (an `https://` URL, checked against `--cacert`).

use std::path::Path;
use std::sync::Arc;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;

/// Where the API is and who asks.
pub struct Client {
    tls: Option<tokio_rustls::TlsConnector>,
    host: String,
    port: u16,
    /// The path the API's paths start under (empty, or a reverse proxy's prefix).
    base: String,
    authorization: String,
}

/// What the API answered: its status and its body, as JSON where it is.
pub struct Answer {
    /// The status.
    pub status: StatusCode,
    /// The body (`Null` for none, a string for text that is not JSON).
    pub body: Value,
}

impl Answer {
    /// The reason a refusal gives, or its status.
    pub fn reason(&self) -> String {
        match self.body.get("reason").and_then(Value::as_str) {
            Some(reason) => format!("{} ({})", reason, self.status),
            None => self.status.to_string(),
        }
    }
}

impl Client {
    /// A client of the API at `url` (`http://host:port` or `https://…`), as `user`.
    pub fn new(
        url: &str,
        user: &str,
        password: &str,
        cacert: Option<&Path>,
    ) -> Result<Client, String> {
        let (tls, rest) = if let Some(rest) = url.strip_prefix("https://") {
            (Some(connector(cacert)?), rest)
        } else if let Some(rest) = url.strip_prefix("http://") {
            (None, rest)
        } else {
            return Err(format!("--url {url:?}: it starts http:// or https://"));
        };
        let (authority, base) = match rest.find('/') {
            Some(at) => (&rest[..at], rest[at..].trim_end_matches('/')),
            None => (rest, ""),
        };
        let default_port = if tls.is_some() { 443 } else { 80 };
        let (host, port) = match authority.rsplit_once(':') {
            Some((host, port)) => (
                host,
                port.parse()
                    .map_err(|_| format!("--url {url:?}: bad port"))?,
            ),
            None => (authority, default_port),
        };
        let credentials = format!("{user}:{password}");
        Ok(Client {
            tls,
            host: host.trim_matches(['[', ']']).to_string(),
            port,
            base: base.to_string(),
            authorization: format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(credentials)
            ),
        })
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Result<Answer, String> {
        self.call(Method::GET, path, None).await
    }

    /// `DELETE path` with RabbitMQ's `X-Reason` header (a connection's close).
    pub async fn delete_with_reason(&self, path: &str, reason: &str) -> Result<Answer, String> {
        self.send_request(Method::DELETE, path, None, Some(reason))
            .await
    }

    /// Sends one request; the body, if any, as JSON.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Answer, String> {
        self.send_request(method, path, body, None).await
    }

    async fn send_request(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        reason: Option<&str>,
    ) -> Result<Answer, String> {
        let failed = |e: &dyn std::fmt::Display| format!("{}:{}: {e}", self.host, self.port);
        let tcp = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| failed(&e))?;
        let mut request = Request::builder();
        if let Some(reason) = reason {
            request = request.header("x-reason", reason);
        }
        let request = request
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header(hyper::header::HOST, format!("{}:{}", self.host, self.port))
            .header(hyper::header::AUTHORIZATION, &self.authorization)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(
                body.map(Value::to_string).unwrap_or_default(),
            )))
            .map_err(|e| failed(&e))?;
        let (status, bytes) = match &self.tls {
            None => send(tcp, request).await,
            Some(connector) => {
                let name = rustls_pki_types::ServerName::try_from(self.host.clone())
                    .map_err(|e| failed(&e))?;
                let stream = connector.connect(name, tcp).await.map_err(|e| failed(&e))?;
                send(stream, request).await
            }
        }
        .map_err(|e| failed(&e))?;
        let body = match bytes.is_empty() {
            true => Value::Null,
            false => serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned())),
        };
        Ok(Answer { status, body })
    }
}

/// Sends `request` on `stream` and reads the whole answer.
async fn send(
    stream: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    request: Request<Full<Bytes>>,
) -> Result<(StatusCode, Bytes), hyper::Error> {
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let response = sender.send_request(request).await?;
    let status = response.status();
    let bytes = response.into_body().collect().await?.to_bytes();
    Ok((status, bytes))
}

/// A TLS connector that trusts the CA certificates of `cacert`.
fn connector(cacert: Option<&Path>) -> Result<tokio_rustls::TlsConnector, String> {
    use rustls_pki_types::pem::PemObject as _;
    let path =
        cacert.ok_or("an https:// URL needs --cacert FILE (the CA that signed the server)")?;
    let mut roots = rustls::RootCertStore::empty();
    let certs = rustls_pki_types::CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    for cert in certs {
        let cert = cert.map_err(|e| format!("{}: {e}", path.display()))?;
        roots
            .add(cert)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// `text` percent-encoded for a path segment (`/` as `%2F`).
pub fn segment(text: &str) -> String {
    leasemq_server::management::percent_encode(text)
}
