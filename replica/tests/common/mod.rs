//! What the replica tests share: an applier that records what it is given, and three
//! replicas of a group over the in-memory network.

#![allow(dead_code)]

pub mod group;

use std::io;
use std::sync::{Arc, Mutex};

use leasemq_replica::{Applied, Applier, Batch};

/// An applier whose state is the list of batches applied, in order; its image is that
/// list, encoded.
#[derive(Clone, Default)]
pub struct Recorder {
    pub applied: Arc<Mutex<Vec<(u64, Batch)>>>,
}

impl Recorder {
    pub fn batches(&self) -> Vec<(u64, Batch)> {
        self.applied.lock().unwrap().clone()
    }
}

impl Applier for Recorder {
    async fn apply(&self, batches: Vec<Applied>) -> io::Result<()> {
        let mut applied = self.applied.lock().unwrap();
        applied.extend(batches.into_iter().map(|a| (a.log_id.index, a.batch)));
        Ok(())
    }

    async fn image(&self) -> io::Result<Vec<u8>> {
        Ok(self.encode())
    }

    async fn install(&self, image: Vec<u8>) -> io::Result<()> {
        self.decode(&image)
    }
}

impl Recorder {
    fn encode(&self) -> Vec<u8> {
        let applied = self.applied.lock().unwrap();
        let mut bytes = Vec::new();
        for (index, batch) in applied.iter() {
            bytes.extend_from_slice(&index.to_le_bytes());
            bytes.extend_from_slice(&batch.inc.to_le_bytes());
            bytes.extend_from_slice(&batch.p.to_le_bytes());
            bytes.extend_from_slice(&(batch.changes.len() as u64).to_le_bytes());
            bytes.extend_from_slice(&batch.changes);
        }
        bytes
    }

    fn decode(&self, image: &[u8]) -> io::Result<()> {
        let mut batches = Vec::new();
        let mut rest = image;
        let take = |n: usize, rest: &mut &[u8]| -> io::Result<Vec<u8>> {
            if rest.len() < n {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "image cut short",
                ));
            }
            let (head, tail) = rest.split_at(n);
            *rest = tail;
            Ok(head.to_vec())
        };
        while !rest.is_empty() {
            let index = u64::from_le_bytes(take(8, &mut rest)?.try_into().unwrap());
            let inc = u32::from_le_bytes(take(4, &mut rest)?.try_into().unwrap());
            let p = u64::from_le_bytes(take(8, &mut rest)?.try_into().unwrap());
            let len = u64::from_le_bytes(take(8, &mut rest)?.try_into().unwrap());
            let changes = take(len as usize, &mut rest)?;
            batches.push((index, Batch { inc, p, changes }));
        }
        *self.applied.lock().unwrap() = batches;
        Ok(())
    }
}

impl group::TestApplier for Recorder {
    fn fresh() -> Recorder {
        Recorder::default()
    }

    fn state(&self) -> Vec<u8> {
        self.encode()
    }
}
