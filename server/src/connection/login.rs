//! Logging in and opening a virtual host (contract §10): `start-ok`'s credentials (PLAIN
//! or AMQPLAIN) checked against the server's [`Access`](crate::access::Access), then
//! `connection.open`'s virtual host checked for the user. What the user was given there
//! is kept for the permission checks of every method (`permitted.rs`).
//!
//! A refused login is RabbitMQ's 403 ACCESS_REFUSED at `connection.close`, in RabbitMQ's
//! words, which do not say whether the user exists; the user name and the mechanism are
//! kept for the server's log (the peer's address is the driver's), never the password.

use std::sync::Arc;

use amq_protocol::protocol::{connection, AMQPClass};
use amq_protocol::types::AMQPValue;

use super::fault::Fault;
use super::{code, Connection};
use crate::access::{LoginRefused, Permissions, User};

/// The mechanisms `connection.start` offers; EXTERNAL too to a client that showed a
/// verified certificate.
const MECHANISMS: &str = "PLAIN AMQPLAIN";

/// The mechanisms with EXTERNAL.
const WITH_EXTERNAL: &str = "PLAIN AMQPLAIN EXTERNAL";

/// Who a connection is, once logged in, and what it may do in its virtual host.
#[derive(Debug)]
pub(super) struct Login {
    /// Its peer connected from a loopback address.
    peer_is_loopback: bool,
    /// The user it logged in as.
    pub(super) user: Option<Arc<User>>,
    /// The virtual host it opened.
    pub(super) vhost: String,
    /// The user's permissions there, once opened.
    pub(super) permissions: Option<Arc<Permissions>>,
    /// Whether they are short of every permission on everything: only then are methods
    /// checked (`permitted.rs`).
    pub(super) restricted: bool,
    /// A refused login: the user name given and the mechanism, for the log.
    pub(super) refused: Option<(String, String)>,
    /// The subject CN of the client certificate the TLS handshake verified: the user
    /// EXTERNAL logs in as.
    pub(super) certificate_name: Option<String>,
    /// What the client said of itself in `start-ok`, for the management API.
    pub(super) client_properties: serde_json::Value,
}

impl Login {
    pub(super) fn new(peer_is_loopback: bool) -> Login {
        Login {
            peer_is_loopback,
            user: None,
            vhost: String::new(),
            permissions: None,
            restricted: true,
            refused: None,
            certificate_name: None,
            client_properties: serde_json::Value::Null,
        }
    }

    /// The mechanisms this connection is offered.
    pub(super) fn mechanisms(&self) -> &'static str {
        match self.certificate_name {
            Some(_) => WITH_EXTERNAL,
            None => MECHANISMS,
        }
    }

    /// The user's name ("" before login).
    pub(super) fn user_name(&self) -> &str {
        self.user.as_ref().map_or("", |u| u.name.as_str())
    }
}

/// The user name and password of a `start-ok` response; `None` where it is malformed.
fn credentials(mechanism: &str, response: &[u8]) -> Option<(String, Vec<u8>)> {
    match mechanism {
        // RFC 4616: [authzid] NUL authcid NUL passwd.
        "PLAIN" => {
            let mut parts = response.split(|&b| b == 0);
            let (_, user, password) = (parts.next()?, parts.next()?, parts.next()?);
            if parts.next().is_some() {
                return None;
            }
            Some((String::from_utf8(user.to_vec()).ok()?, password.to_vec()))
        }
        // A field table without its length: LOGIN and PASSWORD, long strings.
        "AMQPLAIN" => {
            let mut table = u32::try_from(response.len()).ok()?.to_be_bytes().to_vec();
            table.extend_from_slice(response);
            let (_, table) = amq_protocol::types::parsing::parse_field_table(&table[..]).ok()?;
            let text = |key: &str| match table.inner().get(key)? {
                AMQPValue::LongString(s) => Some(s.as_bytes().to_vec()),
                AMQPValue::ShortString(s) => Some(s.as_str().as_bytes().to_vec()),
                _ => None,
            };
            Some((String::from_utf8(text("LOGIN")?).ok()?, text("PASSWORD")?))
        }
        _ => None,
    }
}

impl Connection {
    /// Checks `start-ok`'s credentials: the user is logged in, or the connection closes
    /// with 403 (503 for a mechanism not offered).
    pub(super) fn log_in(&mut self, start_ok: &connection::StartOk) -> Result<(), Fault> {
        let m = || AMQPClass::Connection(connection::AMQPMethod::StartOk(start_ok.clone()));
        let mechanism = start_ok.mechanism.as_str();
        if !self
            .login
            .mechanisms()
            .split(' ')
            .any(|offered| offered == mechanism)
        {
            let text = format!("COMMAND_INVALID - unknown authentication mechanism '{mechanism}'");
            return Err(Fault::connection(code::COMMAND_INVALID, text).for_method(&m()));
        }
        let (access, loopback) = (&self.settings.access, self.login.peer_is_loopback);
        // EXTERNAL's user is the verified certificate's; PLAIN's and AMQPLAIN's come with
        // a password.
        let (user, found) = if mechanism == "EXTERNAL" {
            let user = self.login.certificate_name.clone().unwrap_or_default();
            let found = access.log_in_by_certificate(&user, loopback);
            (user, found)
        } else {
            match credentials(mechanism, start_ok.response.as_bytes()) {
                Some((user, password)) => {
                    let found = access.log_in(&user, &password, loopback);
                    (user, found)
                }
                None => (String::new(), Err(LoginRefused::Credentials)),
            }
        };
        match found {
            Ok(found) => {
                self.login.user = Some(found);
                let properties = crate::field::table_json(&start_ok.client_properties);
                self.login.client_properties = serde_json::Value::Object(properties);
                Ok(())
            }
            Err(why) => Err(self.refuse_login(&user, mechanism, why, &m())),
        }
    }

    fn refuse_login(
        &mut self,
        user: &str,
        mechanism: &str,
        why: LoginRefused,
        m: &AMQPClass,
    ) -> Fault {
        self.settings.metrics.auth_attempts_failed.inc();
        self.login.refused = Some((user.to_string(), mechanism.to_string()));
        let text = match why {
            LoginRefused::Credentials => format!(
                "ACCESS_REFUSED - Login was refused using authentication mechanism {mechanism}. \
                 For details see the broker logfile."
            ),
            LoginRefused::LoopbackOnly => {
                format!("ACCESS_REFUSED - user '{user}' can only connect via localhost")
            }
        };
        Fault::connection(code::ACCESS_REFUSED, text).for_method(m)
    }

    /// Opens `open`'s virtual host for the user: it must exist and the user must have
    /// permissions there, else 530 NOT_ALLOWED as RabbitMQ answers.
    pub(super) fn open_vhost(&mut self, open: &connection::Open) -> Result<(), Fault> {
        let m = || AMQPClass::Connection(connection::AMQPMethod::Open(open.clone()));
        let name = open.virtual_host.as_str();
        let access = &self.settings.access;
        if !access.has_vhost(name) {
            let text = format!("NOT_ALLOWED - vhost {name} not found");
            return Err(Fault::connection(code::NOT_ALLOWED, text).for_method(&m()));
        }
        let user = self.login.user_name();
        let Some(permissions) = access.permissions(user, name) else {
            let text = format!("NOT_ALLOWED - access to vhost '{name}' refused for user '{user}'");
            return Err(Fault::connection(code::NOT_ALLOWED, text).for_method(&m()));
        };
        let Some(vhost) = self.vhosts.get(name) else {
            let text = format!("NOT_ALLOWED - vhost {name} not found");
            return Err(Fault::connection(code::NOT_ALLOWED, text).for_method(&m()));
        };
        self.vhost = vhost;
        self.login.vhost = name.to_string();
        self.login.restricted = !permissions.grants_all();
        self.login.permissions = Some(permissions);
        Ok(())
    }

    /// Opens the virtual host `vhost` for the server's own use, with every permission and
    /// no handshake: a connection through which the server declares what a definitions
    /// file names (`imports.rs`). False where there is no such virtual host.
    pub fn open_for_server(&mut self, vhost: &str) -> bool {
        let Some(found) = self.vhosts.get(vhost) else {
            return false;
        };
        self.vhost = found;
        self.login.vhost = vhost.to_string();
        self.login.permissions = Some(Arc::new(Permissions::all()));
        self.login.restricted = false;
        self.frame_max = self.settings.frame_max as usize;
        self.phase = super::Phase::Open;
        true
    }

    /// Opens the virtual host `vhost` as `user`, with no handshake: a connection through
    /// which the management API acts for a user, with the permissions it has there.
    ///
    /// # Errors
    ///
    /// No such virtual host, or the user has no permissions there, in RabbitMQ's words.
    pub fn open_as(&mut self, user: Arc<User>, vhost: &str) -> Result<(), String> {
        let Some(found) = self.vhosts.get(vhost) else {
            return Err(format!("vhost {vhost} not found"));
        };
        let Some(permissions) = self.settings.access.permissions(&user.name, vhost) else {
            let name = &user.name;
            return Err(format!(
                "access to vhost '{vhost}' refused for user '{name}'"
            ));
        };
        self.vhost = found;
        self.login.vhost = vhost.to_string();
        self.login.restricted = !permissions.grants_all();
        self.login.permissions = Some(permissions);
        self.login.user = Some(user);
        self.frame_max = self.settings.frame_max as usize;
        self.phase = super::Phase::Open;
        Ok(())
    }

    /// The client certificate's subject CN, verified by the TLS handshake: EXTERNAL is
    /// offered, and logs in as the user of that name.
    pub fn set_certificate_name(&mut self, name: String) {
        self.login.certificate_name = Some(name);
    }

    /// The user name and mechanism of a login this connection refused, for the log.
    pub fn refused_login(&self) -> Option<(&str, &str)> {
        let (user, mechanism) = self.login.refused.as_ref()?;
        Some((user, mechanism))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_takes_three_parts_and_an_empty_authzid() {
        assert_eq!(
            credentials("PLAIN", b"\0app\0pw"),
            Some(("app".into(), b"pw".to_vec()))
        );
        assert_eq!(
            credentials("PLAIN", b"admin\0app\0pw"),
            Some(("app".into(), b"pw".to_vec()))
        );
        assert_eq!(credentials("PLAIN", b"\0app"), None);
        assert_eq!(credentials("PLAIN", b"\0app\0pw\0more"), None);
        assert_eq!(credentials("PLAIN", b"\0\xff\0pw"), None);
    }

    #[test]
    fn amqplain_reads_login_and_password_from_its_table() {
        use amq_protocol::auth::{Credentials, SASLMechanism};
        let response =
            Credentials::new("app".into(), "pw".into()).sasl_auth_string(SASLMechanism::AMQPlain);
        assert_eq!(
            credentials("AMQPLAIN", response.as_bytes()),
            Some(("app".into(), b"pw".to_vec()))
        );
        assert_eq!(credentials("AMQPLAIN", b"garbage"), None);
        assert_eq!(credentials("AMQPLAIN", &[]), None);
    }
}
