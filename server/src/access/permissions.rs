//! A user's permissions in one virtual host, as RabbitMQ checks them: three regular
//! expressions, `configure`, `write` and `read`, each matched against a resource's name.
//! RabbitMQ searches the name for the expression (it is anchored only where it says
//! `^`/`$`), takes an empty expression as `^$` (nothing but the empty name), and calls the
//! default exchange `amq.default` for this.

use regex::Regex;

/// One of the three permissions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    /// Declaring (not passively) and deleting.
    Configure,
    /// Publishing to an exchange; binding a queue or exchange as a destination.
    Write,
    /// Consuming, getting, purging; binding from an exchange as a source.
    Read,
}

/// What a permission is checked on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// A queue.
    Queue,
    /// An exchange.
    Exchange,
}

impl Resource {
    /// How RabbitMQ's refusals name it.
    pub fn word(self) -> &'static str {
        match self {
            Resource::Queue => "queue",
            Resource::Exchange => "exchange",
        }
    }
}

/// One permission's expression.
#[derive(Debug, Clone)]
pub struct Pattern {
    /// As given.
    source: String,
    /// `None` where it matches every name (`.*`, the usual grant), so that the check on
    /// every publish is a branch.
    regex: Option<Regex>,
}

impl Pattern {
    /// The pattern RabbitMQ reads `source` as; an error where it does not compile.
    pub fn new(source: &str) -> Result<Pattern, regex::Error> {
        let regex = match source {
            ".*" | "^.*" | "^.*$" | ".*$" => None,
            "" => Some(Regex::new("^$")?),
            other => Some(Regex::new(other)?),
        };
        Ok(Pattern {
            source: source.to_string(),
            regex,
        })
    }

    /// Whether it grants the resource called `name`.
    pub fn matches(&self, name: &str) -> bool {
        self.regex.as_ref().is_none_or(|r| r.is_match(name))
    }

    /// As given.
    pub fn source(&self) -> &str {
        &self.source
    }
}

/// A user's three permissions in one virtual host.
#[derive(Debug, Clone)]
pub struct Permissions {
    /// Declaring and deleting.
    pub configure: Pattern,
    /// Publishing and binding to.
    pub write: Pattern,
    /// Consuming, getting, purging and binding from.
    pub read: Pattern,
}

impl Permissions {
    /// Every permission on every resource (`.*` three times).
    pub fn all() -> Permissions {
        let all = Pattern::new(".*").expect("compiles");
        Permissions {
            configure: all.clone(),
            write: all.clone(),
            read: all,
        }
    }

    /// Whether all three grant every name.
    pub fn grants_all(&self) -> bool {
        [&self.configure, &self.write, &self.read]
            .iter()
            .all(|p| p.regex.is_none())
    }

    /// Whether `permission` on the resource called `name` is granted; `name` "" is the
    /// default exchange, checked as `amq.default`.
    pub fn allows(&self, permission: Permission, resource: Resource, name: &str) -> bool {
        let name = match (resource, name) {
            (Resource::Exchange, "") => "amq.default",
            _ => name,
        };
        let pattern = match permission {
            Permission::Configure => &self.configure,
            Permission::Write => &self.write,
            Permission::Read => &self.read,
        };
        pattern.matches(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn permissions(configure: &str, write: &str, read: &str) -> Permissions {
        Permissions {
            configure: Pattern::new(configure).unwrap(),
            write: Pattern::new(write).unwrap(),
            read: Pattern::new(read).unwrap(),
        }
    }

    #[test]
    fn a_pattern_is_searched_for_unless_anchored() {
        let p = Pattern::new("jobs").unwrap();
        assert!(p.matches("jobs") && p.matches("my-jobs-1"));
        assert!(!p.matches("job"));
        let p = Pattern::new("^jobs$").unwrap();
        assert!(p.matches("jobs") && !p.matches("my-jobs"));
        let p = Pattern::new("^(jobs|tasks)\\.").unwrap();
        assert!(p.matches("tasks.email") && !p.matches("x.tasks.email"));
    }

    #[test]
    fn an_empty_pattern_grants_only_the_empty_name_and_dot_star_everything() {
        let none = Pattern::new("").unwrap();
        assert!(none.matches("") && !none.matches("q") && !none.matches("amq.default"));
        for all in [".*", "^.*", "^.*$", ".*$"] {
            let p = Pattern::new(all).unwrap();
            assert!(p.matches("") && p.matches("anything at all"), "{all}");
            assert_eq!(p.source(), all);
        }
    }

    #[test]
    fn each_permission_is_checked_against_its_own_pattern() {
        let p = permissions("^own-", "^(own-|amq\\.default$)", "^shared-");
        use Permission::*;
        use Resource::*;
        assert!(p.allows(Configure, Queue, "own-1"));
        assert!(!p.allows(Configure, Queue, "shared-1"));
        assert!(p.allows(Read, Queue, "shared-1"));
        assert!(!p.allows(Read, Queue, "own-1"));
        // The default exchange is checked by its name.
        assert!(p.allows(Write, Exchange, ""));
        assert!(!p.allows(Configure, Exchange, ""));
        assert!(!p.allows(Write, Exchange, "amq.topic"));
        let all = Permissions::all();
        assert!(all.grants_all() && !p.grants_all());
        assert!([Configure, Write, Read]
            .iter()
            .all(|&perm| all.allows(perm, Queue, "q") && all.allows(perm, Exchange, "")));
    }

    #[test]
    fn a_pattern_that_does_not_compile_is_an_error() {
        assert!(Pattern::new("(unclosed").is_err());
        assert!(Pattern::new("a{2,1}").is_err());
    }
}
