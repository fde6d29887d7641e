//! Who may connect and what they may do (contract §10): users with RabbitMQ's password
//! hashes, the virtual hosts, and each user's permissions in each.
//!
//! [`Access`] is built at start: from `--definitions` (a RabbitMQ definitions file,
//! `definitions.rs`), from `--user NAME:PASSWORD`, or as RabbitMQ's default `guest` user.
//! With a data dir, what a definitions file gave is kept there (`access.json`, in the
//! same format) and read from there at later starts; the file is read for users only
//! while the data dir has none. The management API changes it at run time
//! (`changes.rs`): each change is written to `access.json` before it is answered.
//!
//! A connection asks it once at login ([`Access::log_in`]) and once when it opens its
//! virtual host ([`Access::permissions`]); it then keeps the [`Permissions`] it was given
//! and checks every method against them itself.
//!
//! What it must not know: connections, frames, queues.

mod changes;
mod definitions;
mod hash;
mod permissions;

pub use changes::{ChangeRefused, Made};
pub use definitions::{
    BindingDef, Definitions, ExchangeDef, PermissionDef, QueueDef, UserDef, VHostDef,
};
pub use hash::{Algorithm, PasswordHash};
pub use permissions::{Pattern, Permission, Permissions, Resource};

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, RwLockReadGuard};

/// The virtual host every server has.
pub const DEFAULT_VHOST: &str = "/";

/// The file in a data dir that keeps users, virtual hosts and permissions.
pub const ACCESS_FILE: &str = "access.json";

/// A user who may log in.
#[derive(Debug, Clone)]
pub struct User {
    /// Its name.
    pub name: String,
    /// Its password's hash; `None`: it cannot log in with a password.
    pub hash: Option<PasswordHash>,
    /// Its RabbitMQ tags.
    pub tags: Vec<String>,
    /// Whether it may log in only from a loopback address (RabbitMQ's `loopback_users`,
    /// which holds `guest` by default).
    pub loopback_only: bool,
}

/// Why a login was refused. What the client is told is the same for both first two
/// (RabbitMQ's words, which do not say whether the user exists).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoginRefused {
    /// No such user, or not its password, or a user with no password.
    Credentials,
    /// A loopback-only user from another address.
    LoopbackOnly,
}

/// Users, virtual hosts and permissions; see the module docs.
#[derive(Debug)]
pub struct Access {
    table: RwLock<Table>,
    /// Where changes are kept: `access.json` in the data dir, with one.
    kept: Option<PathBuf>,
    /// Checked when a user name is unknown, so that a refusal takes as long either way.
    decoy: PasswordHash,
}

/// What [`Access`] holds.
#[derive(Debug, Clone, Default)]
struct Table {
    users: HashMap<String, Arc<User>>,
    vhosts: BTreeSet<String>,
    permissions: HashMap<(String, String), Arc<Permissions>>,
}

impl Default for Access {
    /// RabbitMQ's default: the user `guest`, password `guest`, from loopback only, with
    /// every permission on `/`.
    fn default() -> Access {
        let access = Access::one_user("guest", "guest");
        if let Some(guest) = access.write().users.get_mut("guest") {
            Arc::make_mut(guest).loopback_only = true;
        }
        access
    }
}

impl Access {
    /// One administrator with every permission on `/`, from any address (`--user`).
    pub fn one_user(name: &str, password: &str) -> Access {
        let mut table = Table::empty();
        let user = User {
            name: name.to_string(),
            hash: Some(PasswordHash::new(Algorithm::Sha256, password.as_bytes())),
            tags: vec!["administrator".to_string()],
            loopback_only: false,
        };
        table.users.insert(name.to_string(), Arc::new(user));
        let key = (name.to_string(), DEFAULT_VHOST.to_string());
        table.permissions.insert(key, Arc::new(Permissions::all()));
        Access::of(table)
    }

    fn of(table: Table) -> Access {
        Access {
            table: RwLock::new(table),
            kept: None,
            decoy: PasswordHash::new(Algorithm::Sha256, b"decoy"),
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, Table> {
        self.table.read().expect("never poisoned")
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Table> {
        self.table.write().expect("never poisoned")
    }

    /// What `definitions` say of users, virtual hosts and permissions: an error names the
    /// entry and what is wrong with it (a hash that does not read, an algorithm leasemqd
    /// does not take, a regular expression that does not compile, a user or virtual host
    /// that is not defined).
    pub fn from_definitions(definitions: &Definitions) -> Result<Access, String> {
        Table::from_definitions(definitions).map(Access::of)
    }

    /// Logs `user` in with `password`, from a loopback address or not.
    pub fn log_in(
        &self,
        user: &str,
        password: &[u8],
        from_loopback: bool,
    ) -> Result<Arc<User>, LoginRefused> {
        let found = self.read().users.get(user).cloned();
        let Some(found) = found else {
            self.decoy.verify(password);
            return Err(LoginRefused::Credentials);
        };
        let Some(hash) = &found.hash else {
            self.decoy.verify(password);
            return Err(LoginRefused::Credentials);
        };
        if !hash.verify(password) {
            return Err(LoginRefused::Credentials);
        }
        admitted(&found, from_loopback)
    }

    /// Logs `user` in by a client certificate whose subject CN is its name (EXTERNAL):
    /// the certificate was verified with the TLS handshake, so no password is asked.
    pub fn log_in_by_certificate(
        &self,
        user: &str,
        from_loopback: bool,
    ) -> Result<Arc<User>, LoginRefused> {
        let found = self.read().users.get(user).cloned();
        admitted(&found.ok_or(LoginRefused::Credentials)?, from_loopback)
    }

    /// Whether the virtual host `name` exists.
    pub fn has_vhost(&self, name: &str) -> bool {
        self.read().vhosts.contains(name)
    }

    /// The virtual hosts, by name.
    pub fn vhosts(&self) -> Vec<String> {
        self.read().vhosts.iter().cloned().collect()
    }

    /// The user called `name`.
    pub fn user(&self, name: &str) -> Option<Arc<User>> {
        self.read().users.get(name).cloned()
    }

    /// `user`'s permissions in `vhost`; `None` where it has none there.
    pub fn permissions(&self, user: &str, vhost: &str) -> Option<Arc<Permissions>> {
        (self.read().permissions)
            .get(&(user.to_string(), vhost.to_string()))
            .cloned()
    }

    /// As a definitions file: users (with their hashes), virtual hosts and permissions.
    pub fn to_definitions(&self) -> Definitions {
        self.read().to_definitions()
    }

    /// What the server starts with, given a data dir and `--definitions`: what the data
    /// dir keeps, or else what the file defines, which is then kept in the data dir.
    /// `None` where neither has users (the caller's default then holds).
    pub fn load(
        data_dir: Option<&Path>,
        definitions: Option<(&Path, &Definitions)>,
    ) -> Result<Option<Access>, String> {
        let kept = data_dir.map(|dir| dir.join(ACCESS_FILE));
        if let Some(kept) = kept.as_ref().filter(|k| k.exists()) {
            let (_, stored) = read_definitions(kept)?;
            let access = Access::from_definitions(&stored)
                .map_err(|e| format!("{}: {e}", kept.display()))?;
            return Ok(Some(access.kept_in(data_dir)));
        }
        let Some((file, definitions)) = definitions else {
            return Ok(None);
        };
        let access = Access::from_definitions(definitions)
            .map_err(|e| format!("{}: {e}", file.display()))?;
        if let Some(kept) = kept {
            write_atomically(&kept, &access.to_definitions())?;
        }
        Ok(Some(access.kept_in(data_dir)))
    }

    /// What a server starts with, from its flags: `--user NAME:PASSWORD` (one
    /// administrator, changes not kept), or what the data dir keeps, or what the
    /// `--definitions` file defines, or RabbitMQ's `guest`.
    ///
    /// # Errors
    ///
    /// A `--user` that is not NAME:PASSWORD; a file that does not read or load.
    pub fn from_flags(
        user: Option<&str>,
        data_dir: Option<&Path>,
        definitions: Option<(&Path, &Definitions)>,
    ) -> Result<Access, String> {
        if let Some(user) = user {
            let Some((name, password)) = user.split_once(':').filter(|(n, _)| !n.is_empty()) else {
                return Err("--user is not NAME:PASSWORD".to_string());
            };
            return Ok(Access::one_user(name, password));
        }
        if let Some((path, d)) = definitions {
            for skipped in d.skipped() {
                let path = path.display();
                tracing::info!("{path}: {skipped} skipped: leasemqd has no use for them");
            }
        }
        let loaded = Access::load(data_dir, definitions)?;
        Ok(loaded.unwrap_or_else(|| Access::default().kept_in(data_dir)))
    }

    /// This access, its run-time changes kept in `data_dir` (`access.json`), if given.
    pub fn kept_in(mut self, data_dir: Option<&Path>) -> Access {
        self.kept = data_dir.map(|dir| dir.join(ACCESS_FILE));
        self
    }
}

impl Table {
    fn to_definitions(&self) -> Definitions {
        let mut users: Vec<UserDef> = (self.users.values())
            .map(|u| UserDef {
                name: u.name.clone(),
                password_hash: u
                    .hash
                    .as_ref()
                    .map(PasswordHash::to_base64)
                    .unwrap_or_default(),
                hashing_algorithm: u.hash.as_ref().map(|h| h.algorithm().name().to_string()),
                tags: u.tags.clone(),
            })
            .collect();
        users.sort_by(|a, b| a.name.cmp(&b.name));
        let mut permissions: Vec<PermissionDef> = (self.permissions.iter())
            .map(|((user, vhost), p)| PermissionDef {
                user: user.clone(),
                vhost: vhost.clone(),
                configure: p.configure.source().to_string(),
                write: p.write.source().to_string(),
                read: p.read.source().to_string(),
            })
            .collect();
        permissions.sort_by(|a, b| (&a.user, &a.vhost).cmp(&(&b.user, &b.vhost)));
        Definitions {
            users,
            vhosts: (self.vhosts.iter())
                .map(|name| VHostDef { name: name.clone() })
                .collect(),
            permissions,
            ..Definitions::default()
        }
    }

    /// A table with `/` and nothing else.
    fn empty() -> Table {
        Table {
            vhosts: BTreeSet::from([DEFAULT_VHOST.to_string()]),
            ..Table::default()
        }
    }

    fn from_definitions(definitions: &Definitions) -> Result<Table, String> {
        let mut access = Table::empty();
        for v in &definitions.vhosts {
            access.vhosts.insert(v.name.clone());
        }
        for u in &definitions.users {
            let user = user_of(u).map_err(|e| format!("user {:?}: {e}", u.name))?;
            if access
                .users
                .insert(u.name.clone(), Arc::new(user))
                .is_some()
            {
                return Err(format!("user {:?} is defined twice", u.name));
            }
        }
        for p in &definitions.permissions {
            let entry = format!("permissions of user {:?} in vhost {:?}", p.user, p.vhost);
            if !access.users.contains_key(&p.user) {
                return Err(format!("{entry}: no such user"));
            }
            if !access.vhosts.contains(&p.vhost) {
                return Err(format!("{entry}: no such vhost"));
            }
            let pattern = |which: &str, source: &str| {
                Pattern::new(source).map_err(|e| format!("{entry}: {which} {source:?}: {e}"))
            };
            let permissions = Permissions {
                configure: pattern("configure", &p.configure)?,
                write: pattern("write", &p.write)?,
                read: pattern("read", &p.read)?,
            };
            let key = (p.user.clone(), p.vhost.clone());
            access.permissions.insert(key, Arc::new(permissions));
        }
        for (what, vhost, name) in declared(definitions) {
            if !access.vhosts.contains(vhost) {
                return Err(format!("{what} {name:?}: no such vhost {vhost:?}"));
            }
        }
        Ok(access)
    }
}

/// `user`, whose credentials checked out, from a loopback address or not.
fn admitted(user: &Arc<User>, from_loopback: bool) -> Result<Arc<User>, LoginRefused> {
    if user.loopback_only && !from_loopback {
        return Err(LoginRefused::LoopbackOnly);
    }
    Ok(Arc::clone(user))
}

/// Reads the definitions file at `path`: an error names it and what is wrong.
pub fn read_definitions(path: &Path) -> Result<(PathBuf, Definitions), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let definitions = Definitions::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((path.to_path_buf(), definitions))
}

/// Writes `definitions` to `path` through a temporary file and a rename, synced, so that
/// a crash leaves the old file or the new one.
fn write_atomically(path: &Path, definitions: &Definitions) -> Result<(), String> {
    use std::io::Write as _;
    let failed = |e: std::io::Error| format!("{}: {e}", path.display());
    let text = serde_json::to_vec_pretty(definitions).expect("definitions serialise");
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(failed)?;
    }
    let temporary = path.with_extension("json.tmp");
    let mut file = std::fs::File::create(&temporary).map_err(failed)?;
    file.write_all(&text).map_err(failed)?;
    file.sync_all().map_err(failed)?;
    std::fs::rename(&temporary, path).map_err(failed)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(failed)?;
    }
    Ok(())
}

/// A user of a definitions file, its hash read.
fn user_of(u: &UserDef) -> Result<User, String> {
    let algorithm = match u.hashing_algorithm.as_deref() {
        None => Algorithm::Sha256,
        Some(name) => Algorithm::named(name).ok_or_else(|| {
            format!(
                "hashing_algorithm {name:?} is not taken: rabbit_password_hashing_sha256 or \
                 rabbit_password_hashing_sha512"
            )
        })?,
    };
    let hash = match u.password_hash.as_str() {
        "" => None,
        stored => Some(PasswordHash::parse(algorithm, stored)?),
    };
    Ok(User {
        name: u.name.clone(),
        hash,
        tags: u.tags.clone(),
        loopback_only: u.name == "guest",
    })
}

/// The queues, exchanges and bindings of `definitions`, as (what, vhost, name).
fn declared(definitions: &Definitions) -> impl Iterator<Item = (&'static str, &str, &str)> {
    let queues = (definitions.queues.iter()).map(|q| ("queue", q.vhost.as_str(), q.name.as_str()));
    let exchanges =
        (definitions.exchanges.iter()).map(|e| ("exchange", e.vhost.as_str(), e.name.as_str()));
    let bindings = (definitions.bindings.iter())
        .map(|b| ("binding from", b.vhost.as_str(), b.source.as_str()));
    queues.chain(exchanges).chain(bindings)
}

#[cfg(test)]
mod tests;
