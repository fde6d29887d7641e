//! The raw client's byte stream: a TCP socket, or TLS over one. Both are driven the same
//! way, by readiness: `try_read` and `try_write` never wait, `readable` and `writable`
//! wait for the socket. Over TLS, rustls' own connection state sits between them and
//! the socket: it may hold plaintext already decrypted (then the stream is readable
//! whatever the socket says) and records not yet written (then `holds_back`, and an
//! empty `try_write` writes them).

use std::io::{self, ErrorKind::WouldBlock, Read, Write};

use rustls::pki_types::ServerName;
use rustls::ClientConnection;
use tokio::net::TcpStream;

use super::super::tls::ClientTls;

/// A connected stream, its TLS handshake done where it has one.
pub(super) struct Transport {
    socket: TcpStream,
    tls: Option<Box<ClientConnection>>,
}

/// `std::io` over a tokio socket's non-blocking calls, for rustls.
struct NonBlocking<'a>(&'a TcpStream);

impl Read for NonBlocking<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.try_read(buf)
    }
}

impl Write for NonBlocking<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl Transport {
    /// Over `socket`, connected: plain, or with `tls` a TLS client of server `host`
    /// (the handshake is done when this returns).
    pub(super) async fn new(
        socket: TcpStream,
        host: &str,
        tls: Option<&ClientTls>,
    ) -> io::Result<Transport> {
        let Some(tls) = tls else {
            return Ok(Transport { socket, tls: None });
        };
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let conn = ClientConnection::new(tls.config.clone(), name).map_err(tls_error)?;
        let mut transport = Transport {
            socket,
            tls: Some(Box::new(conn)),
        };
        transport.handshake().await?;
        Ok(transport)
    }

    async fn handshake(&mut self) -> io::Result<()> {
        let Some(tls) = &mut self.tls else {
            return Ok(());
        };
        while tls.is_handshaking() {
            if tls.wants_write() {
                match tls.write_tls(&mut NonBlocking(&self.socket)) {
                    Err(e) if e.kind() == WouldBlock => self.socket.writable().await?,
                    other => {
                        other?;
                    }
                }
                continue;
            }
            self.socket.readable().await?;
            match tls.read_tls(&mut NonBlocking(&self.socket)) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(_) => {
                    tls.process_new_packets().map_err(tls_error)?;
                }
                Err(e) if e.kind() == WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Waits until a `try_read` may find something.
    pub(super) async fn readable(&self) -> io::Result<()> {
        match &self.tls {
            Some(tls) if !tls.wants_read() => Ok(()),
            _ => self.socket.readable().await,
        }
    }

    /// Waits until a `try_write` may take something.
    pub(super) async fn writable(&self) -> io::Result<()> {
        self.socket.writable().await
    }

    /// Reads what is there into `buf` without waiting (`WouldBlock` if nothing is); 0 at
    /// the end of the stream.
    pub(super) fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(tls) = &mut self.tls else {
            return self.socket.try_read(buf);
        };
        loop {
            match tls.reader().read(buf) {
                Err(e) if e.kind() == WouldBlock => {}
                done => return done,
            }
            if tls.read_tls(&mut NonBlocking(&self.socket))? == 0 {
                return Ok(0);
            }
            tls.process_new_packets().map_err(tls_error)?;
        }
    }

    /// Writes what it can of `buf` without waiting (`WouldBlock` if nothing); with an
    /// empty `buf`, writes what TLS holds back, and `WouldBlock` if some remains.
    pub(super) fn try_write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let Some(tls) = &mut self.tls else {
            return self.socket.try_write(buf);
        };
        while tls.wants_write() {
            tls.write_tls(&mut NonBlocking(&self.socket))?;
        }
        if buf.is_empty() {
            return Ok(0);
        }
        let taken = tls.writer().write(buf)?;
        if taken == 0 {
            return Err(WouldBlock.into());
        }
        // Sent on now where the socket takes it; what it does not, the next call sends.
        while tls.wants_write() {
            match tls.write_tls(&mut NonBlocking(&self.socket)) {
                Err(e) if e.kind() == WouldBlock => break,
                other => {
                    other?;
                }
            }
        }
        Ok(taken)
    }

    /// Whether TLS holds written bytes the socket has not taken yet.
    pub(super) fn holds_back(&self) -> bool {
        self.tls.as_ref().is_some_and(|tls| tls.wants_write())
    }
}
