//! Changes to users, virtual hosts and permissions at run time (the management API):
//! each is made on a copy of the table, written to `access.json` where the server keeps
//! one, and only then put in place, so that what is answered is what a restart finds.
//! A connection keeps the permissions it was given when it opened its virtual host.

use std::sync::Arc;

use super::{
    user_of, write_atomically, Access, Pattern, Permissions, Table, User, UserDef, DEFAULT_VHOST,
};

/// Whether a change made something new or replaced what was there (RabbitMQ's 201 and
/// 204).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Made {
    /// It was not there.
    Created,
    /// It was there, and now is as asked.
    Replaced,
}

/// Why a change was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeRefused {
    /// No such user, virtual host or permission entry.
    NotFound,
    /// The request does not make a valid entry (a hash that does not read, a regular
    /// expression that does not compile, the virtual host `/` to delete).
    Invalid(String),
    /// The change could not be kept on disk: nothing changed.
    Storage(String),
}

impl Access {
    /// Applies `change` to a copy of the table; keeps it on disk, then in place.
    fn change<T>(
        &self,
        change: impl FnOnce(&mut Table) -> Result<T, ChangeRefused>,
    ) -> Result<T, ChangeRefused> {
        let mut table = self.write();
        let mut changed = table.clone();
        let answer = change(&mut changed)?;
        if let Some(kept) = &self.kept {
            write_atomically(kept, &changed.to_definitions()).map_err(ChangeRefused::Storage)?;
        }
        *table = changed;
        Ok(answer)
    }

    /// Adds or replaces the user `def` describes (a password hash, or none).
    pub fn put_user(&self, def: &UserDef) -> Result<Made, ChangeRefused> {
        let user = user_of(def).map_err(ChangeRefused::Invalid)?;
        self.put_user_as(user)
    }

    /// Adds or replaces `user`.
    pub fn put_user_as(&self, user: User) -> Result<Made, ChangeRefused> {
        self.change(|t| {
            let name = user.name.clone();
            Ok(match t.users.insert(name, Arc::new(user)) {
                None => Made::Created,
                Some(_) => Made::Replaced,
            })
        })
    }

    /// Deletes the user `name` and its permissions.
    pub fn delete_user(&self, name: &str) -> Result<(), ChangeRefused> {
        self.change(|t| {
            t.users.remove(name).ok_or(ChangeRefused::NotFound)?;
            t.permissions.retain(|(user, _), _| user != name);
            Ok(())
        })
    }

    /// Sets `user`'s permissions in `vhost` from three regular expressions.
    pub fn put_permissions(
        &self,
        user: &str,
        vhost: &str,
        [configure, write, read]: [&str; 3],
    ) -> Result<Made, ChangeRefused> {
        let pattern = |which: &str, source: &str| {
            Pattern::new(source).map_err(|e| ChangeRefused::Invalid(format!("{which}: {e}")))
        };
        let permissions = Permissions {
            configure: pattern("configure", configure)?,
            write: pattern("write", write)?,
            read: pattern("read", read)?,
        };
        self.change(|t| {
            if !t.users.contains_key(user) || !t.vhosts.contains(vhost) {
                return Err(ChangeRefused::NotFound);
            }
            let key = (user.to_string(), vhost.to_string());
            Ok(match t.permissions.insert(key, Arc::new(permissions)) {
                None => Made::Created,
                Some(_) => Made::Replaced,
            })
        })
    }

    /// Clears `user`'s permissions in `vhost`.
    pub fn delete_permissions(&self, user: &str, vhost: &str) -> Result<(), ChangeRefused> {
        self.change(|t| {
            let key = (user.to_string(), vhost.to_string());
            t.permissions
                .remove(&key)
                .map(|_| ())
                .ok_or(ChangeRefused::NotFound)
        })
    }

    /// Adds the virtual host `name`; with `granted_to`, that user gets every permission
    /// there (as RabbitMQ grants its creator through the management API).
    pub fn add_vhost(&self, name: &str, granted_to: Option<&str>) -> Result<Made, ChangeRefused> {
        if name.is_empty() {
            return Err(ChangeRefused::Invalid("a vhost needs a name".into()));
        }
        self.change(|t| {
            if !t.vhosts.insert(name.to_string()) {
                return Ok(Made::Replaced);
            }
            if let Some(user) = granted_to.filter(|u| t.users.contains_key(*u)) {
                let key = (user.to_string(), name.to_string());
                t.permissions.insert(key, Arc::new(Permissions::all()));
            }
            Ok(Made::Created)
        })
    }

    /// Deletes the virtual host `name` and every permission in it; `/` stays.
    pub fn delete_vhost(&self, name: &str) -> Result<(), ChangeRefused> {
        if name == DEFAULT_VHOST {
            return Err(ChangeRefused::Invalid(
                "the vhost / is the server's own".into(),
            ));
        }
        self.change(|t| {
            if !t.vhosts.remove(name) {
                return Err(ChangeRefused::NotFound);
            }
            t.permissions.retain(|(_, vhost), _| vhost != name);
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::{Algorithm, PasswordHash, Permission, Resource};

    fn user(name: &str, password: &str) -> UserDef {
        UserDef {
            name: name.into(),
            password_hash: PasswordHash::new(Algorithm::Sha256, password.as_bytes()).to_base64(),
            hashing_algorithm: None,
            tags: vec!["management".into()],
        }
    }

    #[test]
    fn users_permissions_and_vhosts_change_and_are_kept_before_they_are_answered() {
        let dir = tempfile::tempdir().unwrap();
        let access = Access::default().kept_in(Some(dir.path()));
        assert_eq!(access.put_user(&user("app", "pw")).unwrap(), Made::Created);
        assert_eq!(
            access.put_user(&user("app", "pw2")).unwrap(),
            Made::Replaced
        );
        assert!(access.log_in("app", b"pw2", false).is_ok());
        assert!(access.log_in("app", b"pw", false).is_err());
        assert_eq!(
            access.add_vhost("orders", Some("guest")).unwrap(),
            Made::Created
        );
        assert!(access.permissions("guest", "orders").unwrap().grants_all());
        let made = access
            .put_permissions("app", "orders", ["", ".*", "^jobs$"])
            .unwrap();
        assert_eq!(made, Made::Created);
        let p = access.permissions("app", "orders").unwrap();
        assert!(p.allows(Permission::Read, Resource::Queue, "jobs"));
        assert!(!p.allows(Permission::Configure, Resource::Queue, "jobs"));
        assert_eq!(
            access.put_permissions("nobody", "orders", [".*"; 3]),
            Err(ChangeRefused::NotFound)
        );
        assert!(matches!(
            access.put_permissions("app", "orders", ["(", ".*", ".*"]),
            Err(ChangeRefused::Invalid(_))
        ));
        // A restart finds what was answered.
        let again = Access::load(Some(dir.path()), None).unwrap().unwrap();
        assert!(again.log_in("app", b"pw2", false).is_ok());
        assert!(again.permissions("app", "orders").is_some());
        access.delete_vhost("orders").unwrap();
        assert!(access.permissions("app", "orders").is_none() && !access.has_vhost("orders"));
        assert_eq!(
            access.delete_vhost("/"),
            Err(ChangeRefused::Invalid(
                "the vhost / is the server's own".into()
            ))
        );
        access.delete_user("app").unwrap();
        assert_eq!(access.delete_user("app"), Err(ChangeRefused::NotFound));
        let again = Access::load(Some(dir.path()), None).unwrap().unwrap();
        assert!(again.log_in("app", b"pw2", false).is_err() && !again.has_vhost("orders"));
    }
}
