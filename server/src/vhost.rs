//! A virtual host: the queues, exchanges and bindings the server's clients share, what it
//! keeps of each queue by name, and the work it does on them by itself.
//!
//! [`VHost`] owns the registries a client's methods change: each queue's exclusive owner
//! and declared flags (and, with a data dir, their file), its AMQP consumers, the
//! exchanges and bindings, and the queues that expire, dead-letter or drop their expired
//! messages. Connections reach these through it, never through one another. A server has
//! one per virtual host ([`VHosts`]): `/`, and those its definitions name. The same queue
//! or exchange name in two is two queues or exchanges; a queue's broker name carries its
//! virtual host (`names.rs`), and nothing routes from one to another.
//!
//! Its own work runs in tasks (children of this module), each started by
//! [`VHost::forward_dead_letters`], [`VHost::expire_queues`] and
//! [`VHost::expire_messages`]: dead letters sent on through exchanges, queues deleted by
//! `x-expires`, message TTL at the heads of queues. A restart with a data dir brings back
//! its durable queues' flags ([`VHost::restore`]).
//!
//! What it must not know: connections, channels and frames. It answers in plain values
//! and leaves the AMQP replies to the channel.

mod dead_lettering;
pub mod declare;
mod expiring;
mod message_expiring;
mod restore;

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use leasemq::{Broker, Queue};

use crate::access::DEFAULT_VHOST;
use crate::clock::WallClock;
use crate::consumers::QueueConsumers;
use crate::dead_letter::{self, DeadLetters};
use crate::declared::Declared;
use crate::durable_queues::QueueFile;
use crate::exchange::{Exchanges, Refusal};
use crate::expiry::Expiring;
use crate::message_expiry::MessageExpiry;
use crate::metrics::Metrics;
use crate::names;
use crate::settings::Settings;

/// One virtual host's registries; see the module docs.
#[derive(Debug, Default)]
pub struct VHost {
    /// Its name.
    pub name: String,
    /// The start of its queues' broker names (`names::vhost_prefix`): empty for `/`.
    pub prefix: String,
    /// The exclusive queues of every connection, by name, with the id of the connection
    /// that owns each: another connection may publish to one but not use it otherwise.
    pub exclusive: Mutex<HashMap<String, u64>>,
    /// The flags each queue was declared with, by name, for RabbitMQ's check of a
    /// redeclare; a durable queue's are kept in `queue_file` and come back with it after a
    /// restart ([`VHost::restore`]).
    pub declared: Mutex<HashMap<String, Declared>>,
    /// With a data dir: where the durable queues' entries of `declared` are kept.
    pub queue_file: Option<QueueFile>,
    /// The AMQP consumers of every queue, and which queues one holds exclusively.
    pub consumers: Arc<QueueConsumers>,
    /// The exchanges and bindings every connection routes through.
    pub exchanges: Mutex<Exchanges>,
    /// The queues declared with `x-expires`, deleted once unused that long (`expiry.rs`).
    pub expiring: Expiring,
    /// The queues that dead-letter through an exchange (`dead_letter.rs`).
    pub dead_letters: DeadLetters,
    /// The queues whose messages expire at the head (`message_expiry.rs`).
    pub message_expiry: MessageExpiry,
    /// Set once a queue is declared with `x-message-ttl`: from then on every publish is
    /// stamped with its arrival (before it is routed), not only one with an `expiration`.
    /// Until then none needs it, and stamping would cost every message 8 bytes.
    pub message_ttl_used: AtomicBool,
    /// When messages arrive and expire: the server's wall clock.
    pub clock: WallClock,
    /// Where its tasks count what they do (expired and dropped messages).
    pub metrics: Arc<Metrics>,
    /// Its tasks, once started ([`VHost::start`]).
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
}

impl VHost {
    /// An empty virtual host `/` on the server's clock and metrics.
    pub fn new(settings: &Settings) -> VHost {
        VHost::named(settings, DEFAULT_VHOST)
    }

    /// An empty virtual host called `name`.
    pub fn named(settings: &Settings, name: &str) -> VHost {
        let prefix = names::vhost_prefix(name);
        VHost {
            name: name.to_string(),
            exchanges: Mutex::new(Exchanges::default().in_vhost(name)),
            prefix,
            clock: settings.clock.clone(),
            metrics: Arc::clone(&settings.metrics),
            ..VHost::default()
        }
    }

    /// The virtual host `name` with what `data_dir` (the server's) keeps of it, if given.
    ///
    /// # Errors
    ///
    /// A file of the data dir that cannot be read, parsed or rewritten.
    pub fn opened(
        settings: &Settings,
        name: &str,
        data_dir: Option<&std::path::Path>,
        broker: &Broker,
    ) -> Result<VHost, String> {
        let mut vhost = VHost::named(settings, name);
        if let Some(dir) = data_dir {
            vhost.open_data_dir(&data_dir_of(dir, name)?, broker)?;
        }
        Ok(vhost)
    }

    /// Starts its own tasks (see the module docs), which run until [`VHost::stop`]:
    /// `x-expires` deletions, dead letters sent on through exchanges, message TTL at the
    /// heads of queues.
    pub fn start(self: &Arc<Self>, broker: &Broker) {
        let tasks = [
            tokio::spawn(Arc::clone(self).expire_queues()),
            tokio::spawn(Arc::clone(self).forward_dead_letters(broker.clone())),
            tokio::spawn(Arc::clone(self).expire_messages(broker.clone())),
        ];
        let mut running = self.tasks.lock().expect("never poisoned");
        running.extend(tasks.iter().map(tokio::task::JoinHandle::abort_handle));
    }

    /// Stops its tasks.
    pub fn stop(&self) {
        for task in self.tasks.lock().expect("never poisoned").drain(..) {
            task.abort();
        }
    }

    /// The broker's name for the queue its clients call `name`.
    pub fn broker_name<'a>(&self, name: &'a str) -> std::borrow::Cow<'a, str> {
        names::engine_in(&self.prefix, name)
    }

    /// Brings back what `dir` keeps of this virtual host: its durable exchanges and the
    /// bindings of the queues that came back, and its durable queues as they were
    /// declared (`restore`).
    ///
    /// # Errors
    ///
    /// A file that cannot be read or parsed, or rewritten.
    pub fn open_data_dir(&mut self, dir: &std::path::Path, broker: &Broker) -> Result<(), String> {
        let exchanges = Exchanges::open(dir, |queue| broker.queue(queue).is_some())?;
        self.exchanges = Mutex::new(exchanges.in_vhost(&self.name));
        self.restore(dir, broker)
    }

    /// Deletes `queue` where no connection asked for it (`x-expires`): closes it, and if
    /// that closed it, forgets what the server keeps of it by name.
    pub fn forget_queue(&self, queue: &Queue) {
        // Its owner, if it is exclusive, as it was while the queue was open.
        let owner = (self.exclusive.lock().expect("never poisoned"))
            .get(queue.name())
            .copied();
        if queue.close() {
            self.forget(queue, owner);
        }
    }

    /// Deletes `queue` for the connection `owner` (its delete, or its auto-delete): closes
    /// it, and if that closed it, forgets what the virtual host keeps of it (a queue closed
    /// before, by `x-expires` or another connection, was forgotten then). Waits for the disk
    /// where the queue is durable.
    pub fn delete_queue(&self, broker: &Broker, queue: &Queue, owner: u64) {
        if !queue.close() {
            return;
        }
        let tracked = self.forget(queue, Some(owner));
        // A durable queue brought back by a restart with no declaration kept (from a build
        // that kept none) and deleted before it was declared again may have a holding queue
        // of dead letters that nothing forwards (its route was never said): it goes, with
        // what it holds.
        if !tracked && queue.is_durable() {
            if let Some(holding) = broker.queue(&dead_letter::holding_name(queue.name())) {
                holding.close();
            }
        }
    }

    /// Writes the durable queues' entries of `declared` (the table, whose lock the caller
    /// hands over just after its change) to the data dir, if there is one; the table is
    /// unlocked before the write. A failed write is logged: the queues serve on, and a
    /// restart brings them back as the file last written has them (those missing are as
    /// declared again).
    pub(crate) fn keep_durable_queues(&self, declared: MutexGuard<'_, HashMap<String, Declared>>) {
        let Some(file) = &self.queue_file else {
            return;
        };
        let snapshot = file.snapshot(&declared);
        drop(declared);
        if let Err(why) = file.write(snapshot) {
            tracing::warn!("durable queues' declarations not kept: {why}");
        }
    }

    /// Forgets what the server keeps of the queue called `name`, which was just closed
    /// (by the caller: a queue closed before is forgotten by whoever closed it, and its
    /// name may already be another queue's): its bindings, its declared flags, its
    /// consumers' entry and its expiry, and its exclusive owner if that is `owner`; its
    /// holding queue of dead letters drains and goes. Whether it had one here.
    pub(crate) fn forget(&self, queue: &Queue, owner: Option<u64>) -> bool {
        let name = queue.name();
        let mut owners = self.exclusive.lock().expect("never poisoned");
        if owner.is_some() && owners.get(name) == owner.as_ref() {
            owners.remove(name);
        }
        drop(owners);
        self.consumers.forget(name);
        let mut declared = self.declared.lock().expect("never poisoned");
        if declared.remove(name).is_some_and(|d| d.durable) {
            self.keep_durable_queues(declared);
        } else {
            drop(declared);
        }
        self.expiring.forget_closed(name);
        self.message_expiry.forget_closed(name);
        let dead_letters = self.dead_letters.forget(queue);
        let mut exchanges = self.exchanges.lock().expect("never poisoned");
        if let Err(Refusal::Storage(why)) = exchanges.unbind_queue(name) {
            tracing::warn!("queue {name} was deleted, but its bindings stay on disk: {why}");
        }
        dead_letters
    }
}

/// Where in the data dir `dir` the virtual host `name` keeps its files: `dir` itself for
/// `/` (as before there were others), `vhosts/<name, escaped>` for any other, made if
/// missing.
///
/// # Errors
///
/// The directory cannot be made.
pub fn data_dir_of(dir: &std::path::Path, name: &str) -> Result<std::path::PathBuf, String> {
    let prefix = names::vhost_prefix(name);
    let Some(escaped) = (prefix.strip_prefix(names::IN_VHOST)).and_then(|p| p.strip_suffix('.'))
    else {
        return Ok(dir.to_path_buf());
    };
    let own = dir.join("vhosts").join(escaped);
    std::fs::create_dir_all(&own).map_err(|e| format!("{}: {e}", own.display()))?;
    Ok(own)
}

/// The virtual hosts of a server, by name; `/` is always one. The management API adds
/// and deletes others at run time.
#[derive(Debug)]
pub struct VHosts {
    by_name: RwLock<HashMap<String, Arc<VHost>>>,
}

impl VHosts {
    /// `vhosts`, which must hold `/`.
    pub fn new(vhosts: impl IntoIterator<Item = VHost>) -> VHosts {
        let by_name: HashMap<String, Arc<VHost>> = (vhosts.into_iter())
            .map(|v| (v.name.clone(), Arc::new(v)))
            .collect();
        assert!(
            by_name.contains_key(DEFAULT_VHOST),
            "a server has the vhost /"
        );
        VHosts {
            by_name: RwLock::new(by_name),
        }
    }

    /// The virtual hosts `settings` give access to, each with what `data_dir` keeps of it:
    /// its durable exchanges, the bindings of the durable queues that came back, and
    /// those queues as they were declared (dead-letter routes, TTLs, expiry).
    ///
    /// # Errors
    ///
    /// A file of the data dir that cannot be read, parsed or rewritten.
    pub fn open(
        settings: &Settings,
        data_dir: Option<&std::path::Path>,
        broker: &Broker,
    ) -> Result<VHosts, String> {
        let mut vhosts = Vec::new();
        for name in settings.access.vhosts() {
            vhosts.push(VHost::opened(settings, &name, data_dir, broker)?);
        }
        Ok(VHosts::new(vhosts))
    }

    /// A server with `/` only.
    pub fn one(vhost: Arc<VHost>) -> Arc<VHosts> {
        assert_eq!(vhost.name, DEFAULT_VHOST, "a server has the vhost /");
        let by_name = HashMap::from([(vhost.name.clone(), vhost)]);
        Arc::new(VHosts {
            by_name: RwLock::new(by_name),
        })
    }

    /// The virtual host called `name`.
    pub fn get(&self, name: &str) -> Option<Arc<VHost>> {
        self.by_name
            .read()
            .expect("never poisoned")
            .get(name)
            .cloned()
    }

    /// `/`.
    pub fn default_vhost(&self) -> Arc<VHost> {
        self.get(DEFAULT_VHOST).expect("a server has the vhost /")
    }

    /// Every virtual host, by name.
    pub fn all(&self) -> Vec<Arc<VHost>> {
        let mut all: Vec<Arc<VHost>> = (self.by_name.read().expect("never poisoned").values())
            .cloned()
            .collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Adds `vhost`, unless one of its name is there: the one there.
    pub fn add(&self, vhost: VHost) -> Arc<VHost> {
        let mut by_name = self.by_name.write().expect("never poisoned");
        let name = vhost.name.clone();
        Arc::clone(by_name.entry(name).or_insert_with(|| Arc::new(vhost)))
    }

    /// Takes the virtual host `name` out (never `/`): the one taken.
    pub fn remove(&self, name: &str) -> Option<Arc<VHost>> {
        if name == DEFAULT_VHOST {
            return None;
        }
        self.by_name.write().expect("never poisoned").remove(name)
    }
}
