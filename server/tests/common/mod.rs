//! What the tests that start `leasemqd` processes or make certificates share: a node
//! killed when dropped, free ports, and a CA of a test's own. Each test file uses a part.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Child;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};

/// A `leasemqd` process, killed when dropped, and its plain AMQP address.
pub struct Node {
    pub child: Child,
    pub amqp: String,
    /// Its ready line.
    pub line: String,
}

impl Node {
    /// `child` (spawned with its stdout piped) once it printed its ready line, which must
    /// contain `expect`.
    pub fn ready(mut child: Child, expect: &str) -> Node {
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.contains("ready") && line.contains(expect), "{line}");
        let amqp = line.split("AMQP 0-9-1 on ").nth(1).unwrap();
        let amqp = amqp.split(',').next().unwrap().to_string();
        Node { child, amqp, line }
    }

    /// The management API's address (`--management`), from the ready line.
    pub fn management(&self) -> String {
        let at = self.line.split("management API on http://").nth(1).unwrap();
        at.split("/api/").next().unwrap().to_string()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Free loopback ports.
pub fn ports(n: usize) -> Vec<u16> {
    let listeners: Vec<_> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    (listeners.iter())
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

/// A CA of a test's own, its files in a directory.
pub struct Ca {
    dir: PathBuf,
    pub issuer: CertifiedIssuer<'static, KeyPair>,
    name: String,
}

impl Ca {
    pub fn new(dir: &Path, name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let ca = Ca {
            dir: dir.to_path_buf(),
            issuer,
            name: name.to_string(),
        };
        std::fs::write(ca.cert_file(), ca.issuer.pem()).unwrap();
        ca
    }

    pub fn cert_file(&self) -> PathBuf {
        self.dir.join(format!("{}-ca.pem", self.name))
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A certificate this CA signed for `cn` (also the server's names: localhost and
    /// 127.0.0.1), written with its key as `<cn>.pem` and `<cn>.key`.
    pub fn issue(&self, cn: &str) -> (PathBuf, PathBuf) {
        let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let mut params = CertificateParams::new(names).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (cert_file, key_file) = (
            self.dir.join(format!("{cn}.pem")),
            self.dir.join(format!("{cn}.key")),
        );
        std::fs::write(&cert_file, cert.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        (cert_file, key_file)
    }

    /// `leasemqd`'s TLS flags for a certificate named `cn` that this CA signed, this CA
    /// being the client CA too.
    pub fn flags(&self, cn: &str) -> Vec<String> {
        let (cert, key) = self.issue(cn);
        let path = |p: &Path| p.to_str().unwrap().to_string();
        vec![
            "--tls-cert".into(),
            path(&cert),
            "--tls-key".into(),
            path(&key),
            "--tls-client-ca".into(),
            path(&self.cert_file()),
        ]
    }
}
