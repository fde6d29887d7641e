//! The servers of an AMQP run (`--target`, given once or more, e.g. the nodes of a
//! cluster) and which of them each connection goes to.

use super::masked;
use super::tls::ClientTls;

/// One server a connection goes to: its URI, and the CA that `amqps://` trusts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Target<'a> {
    /// As the user gave it.
    pub(crate) uri: &'a str,
    /// `--tls-ca`, where given.
    pub(crate) tls: Option<&'a ClientTls>,
}

/// The `--target` URIs in the order given, and the run's consumer count.
///
/// The setup connection, which declares the queues and in the end counts and deletes
/// them, goes to the first. The consumers' and producers' connections are dealt out round
/// robin, consumers first, in the order they open: connection k (consumer i is k = i,
/// producer j is k = consumers + j) goes to target k mod n. Each role, and the run as a
/// whole, is then as even over the targets as its count allows.
#[derive(Clone, Copy, Debug)]
pub(super) struct Targets<'a> {
    uris: &'a [String],
    consumers: usize,
    tls: Option<&'a ClientTls>,
}

impl<'a> Targets<'a> {
    /// The targets of a run with `consumers` consumers, trusting `tls` over TLS; `uris`
    /// holds at least one.
    pub(super) fn new(
        uris: &'a [String],
        consumers: usize,
        tls: Option<&'a ClientTls>,
    ) -> Targets<'a> {
        assert!(!uris.is_empty(), "an AMQP run has a target");
        Targets {
            uris,
            consumers,
            tls,
        }
    }

    /// Where the queues are declared, counted and deleted.
    pub(super) fn first(&self) -> Target<'a> {
        self.target(0)
    }

    /// The server of consumer `i`'s connection.
    pub(super) fn consumer(&self, i: usize) -> Target<'a> {
        self.target(i)
    }

    /// The server of producer `j`'s connection.
    pub(super) fn producer(&self, j: usize) -> Target<'a> {
        self.target(self.consumers + j)
    }

    /// The server of the `k`th connection.
    fn target(&self, k: usize) -> Target<'a> {
        Target {
            uri: &self.uris[k % self.uris.len()],
            tls: self.tls,
        }
    }

    /// The targets, passwords hidden, for the title: "amqp://u:***@a/%2f" or, for
    /// several, "amqp://u:***@a/%2f, amqp://u:***@b/%2f".
    pub(super) fn text(&self) -> String {
        self.masked().join(", ")
    }

    /// Each target with its password hidden, in order.
    pub(super) fn masked(&self) -> Vec<String> {
        self.uris.iter().map(|u| masked(u)).collect()
    }

    /// How many targets the run has.
    pub(super) fn len(&self) -> usize {
        self.uris.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uris(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("amqp://guest:guest@127.0.0.1:{}/%2f", 5672 + i))
            .collect()
    }

    #[test]
    fn one_target_takes_every_connection() {
        let all = uris(1);
        let t = Targets::new(&all, 4, None);
        assert!((0..4).all(|i| t.consumer(i).uri == all[0]));
        assert!((0..4).all(|j| t.producer(j).uri == all[0]));
        assert_eq!(t.first().uri, all[0]);
        assert_eq!(t.text(), "amqp://guest:***@127.0.0.1:5672/%2f");
    }

    #[test]
    fn connections_go_round_robin_consumers_first() {
        let all = uris(3);
        let t = Targets::new(&all, 4, None);
        let port = |uri: &str| all.iter().position(|u| u == uri).unwrap();
        let consumers: Vec<usize> = (0..4).map(|i| port(t.consumer(i).uri)).collect();
        let producers: Vec<usize> = (0..4).map(|j| port(t.producer(j).uri)).collect();
        assert_eq!(consumers, [0, 1, 2, 0]);
        assert_eq!(producers, [1, 2, 0, 1]);
        // Eight connections over three servers: 3, 3 and 2.
        let mut per_target = [0; 3];
        for k in consumers.iter().chain(&producers) {
            per_target[*k] += 1;
        }
        assert_eq!(per_target, [3, 3, 2]);
        assert_eq!(t.first().uri, all[0]);
    }

    #[test]
    fn the_title_names_every_target_without_passwords() {
        let all = uris(3);
        let t = Targets::new(&all, 1, None);
        assert_eq!(t.len(), 3);
        assert_eq!(
            t.text(),
            "amqp://guest:***@127.0.0.1:5672/%2f, amqp://guest:***@127.0.0.1:5673/%2f, \
             amqp://guest:***@127.0.0.1:5674/%2f"
        );
    }
}
