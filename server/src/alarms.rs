//! The resource alarms, as RabbitMQ's: memory (`--memory-high-watermark`, `memory.rs`) and
//! free disk space (`--disk-free-limit`, `disk.rs`). While either is raised, publishing
//! connections are blocked and consumers go on, so that queues drain instead of the
//! process growing until the system kills it or the disk filling until writes fail.
//!
//! One task per resource (`resources.rs` starts them) reads it and raises or clears its
//! alarm in the server's [`Alarms`]. A connection that meets a `basic.publish` while an
//! alarm is raised stops there: it takes no more input until every alarm has cleared, and a
//! client that announced the `connection.blocked` capability is told `connection.blocked`
//! (with RabbitMQ's reason, "low on memory", "low on disk" or "low on memory & disk"), then
//! `connection.unblocked`. A connection that only consumes and acks is never blocked.

use std::sync::atomic::{AtomicBool, Ordering};

/// A resource the server watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// The process's resident memory, against `--memory-high-watermark`.
    Memory,
    /// The free space of the data dir's file system, against `--disk-free-limit`.
    Disk,
}

impl Resource {
    /// Every resource, in the order RabbitMQ lists their alarms.
    pub const ALL: [Resource; 2] = [Resource::Memory, Resource::Disk];

    /// The resource's name in RabbitMQ's management API (`/api/health/checks/alarms`).
    pub fn name(self) -> &'static str {
        match self {
            Resource::Memory => "memory",
            Resource::Disk => "disk",
        }
    }
}

/// The server's alarms, shared by every connection.
#[derive(Debug)]
pub struct Alarms {
    memory: AtomicBool,
    disk: AtomicBool,
    /// Tells blocked connections that an alarm changed (they check whether all cleared).
    changed: tokio::sync::watch::Sender<()>,
}

impl Default for Alarms {
    fn default() -> Alarms {
        Alarms {
            memory: AtomicBool::new(false),
            disk: AtomicBool::new(false),
            changed: tokio::sync::watch::Sender::new(()),
        }
    }
}

impl Alarms {
    /// Whether publishing connections are blocked now: some alarm is raised.
    pub fn raised(&self) -> bool {
        Resource::ALL.iter().any(|&r| self.is_raised(r))
    }

    /// Whether the alarm of `resource` is raised.
    pub fn is_raised(&self, resource: Resource) -> bool {
        self.flag(resource).load(Ordering::Relaxed)
    }

    /// The resources whose alarm is raised, in [`Resource::ALL`]'s order.
    pub fn raised_resources(&self) -> Vec<Resource> {
        (Resource::ALL.into_iter())
            .filter(|&r| self.is_raised(r))
            .collect()
    }

    /// Raises (`true`) or clears the alarm of `resource`; waiting connections hear of a
    /// change. Whether it changed.
    pub fn set(&self, resource: Resource, raised: bool) -> bool {
        let changed = self.flag(resource).swap(raised, Ordering::Relaxed) != raised;
        if changed {
            self.changed.send_replace(());
        }
        changed
    }

    /// A receiver that sees each change of an alarm.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<()> {
        self.changed.subscribe()
    }

    /// The reason `connection.blocked` gives, as RabbitMQ words it: "low on " and the
    /// raised alarms' resources joined by " & ".
    pub fn reason(&self) -> String {
        let names: Vec<&str> = (self.raised_resources().into_iter())
            .map(Resource::name)
            .collect();
        format!("low on {}", names.join(" & "))
    }

    fn flag(&self, resource: Resource) -> &AtomicBool {
        match resource {
            Resource::Memory => &self.memory,
            Resource::Disk => &self.disk,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_of_an_alarm_wakes_its_receivers_once() {
        let alarms = Alarms::default();
        let mut rx = alarms.subscribe();
        assert!(!alarms.raised());
        alarms.set(Resource::Memory, true);
        assert!(alarms.raised() && alarms.is_raised(Resource::Memory));
        assert!(rx.has_changed().unwrap());
        rx.borrow_and_update();
        alarms.set(Resource::Memory, true);
        assert!(!rx.has_changed().unwrap(), "no change, no wake");
        alarms.set(Resource::Memory, false);
        assert!(rx.has_changed().unwrap() && !alarms.raised());
    }

    #[test]
    fn either_alarm_blocks_and_the_reason_names_what_is_low() {
        let alarms = Alarms::default();
        alarms.set(Resource::Disk, true);
        assert!(alarms.raised());
        assert_eq!(alarms.reason(), "low on disk");
        alarms.set(Resource::Memory, true);
        assert_eq!(alarms.reason(), "low on memory & disk");
        assert_eq!(
            alarms.raised_resources(),
            [Resource::Memory, Resource::Disk]
        );
        alarms.set(Resource::Disk, false);
        assert_eq!(alarms.reason(), "low on memory");
        alarms.set(Resource::Memory, false);
        assert!(!alarms.raised() && alarms.raised_resources().is_empty());
    }
}
