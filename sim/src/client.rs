//! What producers and consumers ask of the broker: each op of theirs becomes one command
//! for the shard that owns its queue.

use leasemq_engine::{Command, DeliveryTag, Settle};

use crate::op::Op;
use crate::world::World;

impl World {
    /// The command a producer or consumer op sends, and to which shard; `None` when its
    /// target does not exist (a no-op).
    pub(crate) fn client_command(&mut self, op: &Op) -> Option<(usize, Command)> {
        match op {
            Op::Put { queue, handle, msg } => {
                let (shard, key) = self.resolve(*queue, *handle)?;
                let message = self.message(shard, msg);
                Some((
                    shard,
                    Command::Put {
                        queue: key,
                        message,
                    },
                ))
            }
            Op::PutBatch {
                queue,
                handle,
                msgs,
            } => {
                let (shard, key) = self.resolve(*queue, *handle)?;
                let messages = msgs.iter().map(|m| self.message(shard, m)).collect();
                Some((
                    shard,
                    Command::PutBatch {
                        queue: key,
                        messages,
                    },
                ))
            }
            Op::SettleTag {
                queue,
                handle,
                back,
                op,
            } => {
                let q = self.incarnation(*queue, *handle)?;
                let rec = &self.ledger.queues[q as usize];
                let tag = DeliveryTag((rec.last_tag + 1).saturating_sub(u64::from(*back)));
                let cmd = Command::Settle {
                    queue: rec.key,
                    tag,
                    op: *op,
                };
                Some((usize::from(rec.shard), cmd))
            }
            Op::Stats { queue, handle } => {
                let (shard, key) = self.resolve(*queue, *handle)?;
                Some((shard, Command::Stats { queue: key }))
            }
            _ => self.consumer_command(op),
        }
    }

    fn consumer_command(&mut self, op: &Op) -> Option<(usize, Command)> {
        if let Op::AckUpToEnded { consumer } = op {
            // The handle of a consumer that ended: it must ack nothing.
            let n = self.ended.len();
            let c = *self.ended.get(usize::from(*consumer) % n.max(1))?;
            let sc = &self.consumers[c as usize];
            let cmd = Command::AckUpTo {
                consumer: sc.key,
                tag: DeliveryTag(u64::MAX),
            };
            return Some((sc.shard, cmd));
        }
        let consumer = match op {
            Op::Settle { consumer, .. }
            | Op::SettleBatch { consumer, .. }
            | Op::AckUpTo { consumer, .. }
            | Op::Cancel { consumer } => *consumer,
            other => unreachable!("{other:?} is not a consumer's op"),
        };
        let c = self.pick_consumer(consumer)?;
        let cmd = match op {
            Op::Settle { pick, op, .. } => Command::Settle {
                queue: self.consumers[c as usize].queue,
                tag: self.take_from_hand(c, *pick, *op)?,
                op: *op,
            },
            Op::SettleBatch { picks, .. } => Command::SettleBatch {
                queue: self.consumers[c as usize].queue,
                settles: picks
                    .iter()
                    .filter_map(|&(pick, op)| self.take_from_hand(c, pick, op).map(|t| (t, op)))
                    .collect::<Vec<(DeliveryTag, Settle)>>(),
            },
            Op::AckUpTo { pick, .. } => {
                let sc = &mut self.consumers[c as usize];
                let tag = match sc.hand.len() {
                    0 => DeliveryTag(0),
                    n => sc.hand[n - 1 - usize::from(*pick) % n].tag,
                };
                sc.hand.retain(|d| d.tag > tag);
                Command::AckUpTo {
                    consumer: sc.key,
                    tag,
                }
            }
            // A crash: whatever is still unread in the channel is released.
            Op::Cancel { .. } => {
                let sc = &self.consumers[c as usize];
                Command::Cancel {
                    consumer: sc.key,
                    unread: sc.channel.iter().map(|d| d.tag).collect(),
                }
            }
            _ => unreachable!("matched above"),
        };
        Some((self.consumers[c as usize].shard, cmd))
    }
}
