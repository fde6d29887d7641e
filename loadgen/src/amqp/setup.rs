//! The setup connection of an AMQP run: it declares the run's queues on the first target
//! before the clock starts, and at the end counts what is left in them and deletes them.

use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};

use super::queue_args::{field_table, QueueArg};
use super::targets::Target;
use super::{amqp_error, connect};

/// The connection that declares the run's queues, and at the end counts and deletes them.
pub(super) struct Setup {
    conn: Connection,
    channel: Channel,
    /// The arguments table of every `queue.declare` (`--queue-arg`).
    arguments: FieldTable,
}

impl Setup {
    /// Connects to `target` and declares `queues`, `durable` or not, with `queue_args` in
    /// the arguments table of each.
    ///
    /// # Errors
    ///
    /// A server that cannot be reached, or refuses a declaration (e.g. RabbitMQ refuses a
    /// quorum queue that is not durable).
    pub(super) async fn open(
        target: Target<'_>,
        queues: &[String],
        durable: bool,
        queue_args: &[QueueArg],
    ) -> Result<Setup, String> {
        let conn = connect(target, "setup").await?;
        let channel = conn
            .create_channel()
            .await
            .map_err(amqp_error("opening a channel"))?;
        let arguments = field_table(queue_args);
        let options = QueueDeclareOptions {
            durable,
            ..QueueDeclareOptions::default()
        };
        for q in queues {
            channel
                .queue_declare(q.as_str().into(), options, arguments.clone())
                .await
                .map_err(amqp_error("declaring a queue"))?;
        }
        Ok(Setup {
            conn,
            channel,
            arguments,
        })
    }

    /// The messages still ready in `queues`; then deletes them where the server serves
    /// `queue.delete` (a server that does not may close the connection: nothing is lost).
    ///
    /// # Errors
    ///
    /// A server that does not answer the passive `queue.declare` that counts a queue.
    pub(super) async fn close(self, queues: &[String]) -> Result<u64, String> {
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let mut ready = 0;
        for q in queues {
            let answer = self
                .channel
                .queue_declare(q.as_str().into(), passive, self.arguments.clone())
                .await
                .map_err(amqp_error("counting what is left in a queue"))?;
            ready += u64::from(answer.message_count());
        }
        for q in queues {
            let options = QueueDeleteOptions::default();
            if self
                .channel
                .queue_delete(q.as_str().into(), options)
                .await
                .is_err()
            {
                break;
            }
        }
        let _ = self.conn.close(200, "run over".into()).await;
        Ok(ready)
    }
}
