//! How an answer gets back to its caller: a reusable per-thread slot for blocking calls, a
//! oneshot for async ones. Neither blocks the shard thread.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};
use tokio::sync::oneshot;

use crate::protocol::{Answer, Inbox, ReplyTo, Request};
use crate::wait::Sleeper;

/// A thread's answer slot, reused by every blocking call it makes: no channel is created
/// per call.
struct Slot {
    tx: Sender<Answer>,
    rx: Receiver<Answer>,
    caller: Arc<Sleeper>,
}

thread_local! {
    static SLOT: Slot = {
        let (tx, rx) = bounded(1);
        Slot { tx, rx, caller: Arc::new(Sleeper::current()) }
    };
}

/// Sends a request and blocks until its answer comes back: polls the slot for a few
/// microseconds, then parks until the shard wakes this thread (see `wait.rs`).
pub(crate) fn call(inbox: &Inbox, request: impl FnOnce(ReplyTo) -> Request) -> Answer {
    call_waiting(inbox, request, false)
}

/// [`call`], for a request whose answer waits for an fsync (a change to a durable queue):
/// parks at once rather than poll, leaving the cores to the shard and the log's syncer.
pub(crate) fn call_parked(inbox: &Inbox, request: impl FnOnce(ReplyTo) -> Request) -> Answer {
    call_waiting(inbox, request, true)
}

fn call_waiting(inbox: &Inbox, request: impl FnOnce(ReplyTo) -> Request, parked: bool) -> Answer {
    SLOT.with(|slot| {
        let req = request(ReplyTo::slot(slot.tx.clone(), slot.caller.clone()));
        // A request refused by a stopped shard is dropped here, which answers ShutDown.
        drop(inbox.send_and_run(req));
        // Every request is answered, or dropped, which answers ShutDown: the wait ends.
        let answer = || slot.rx.try_recv().ok();
        let got = if parked {
            slot.caller.wait_parked(None, answer)
        } else {
            slot.caller.wait(None, inbox.yields(), answer)
        };
        got.unwrap_or(Answer::ShutDown)
    })
}

/// Sends a request and waits for its answer without blocking the executor's thread.
pub(crate) async fn call_async(inbox: &Inbox, request: impl FnOnce(ReplyTo) -> Request) -> Answer {
    let (tx, rx) = oneshot::channel();
    let mut req = request(ReplyTo::oneshot(tx));
    loop {
        match inbox.try_send(req) {
            Ok(()) => break,
            Err(TrySendError::Full(back)) => {
                req = back;
                YieldNow(false).await;
            }
            Err(TrySendError::Disconnected(_)) => return Answer::ShutDown,
        }
    }
    rx.await.unwrap_or(Answer::ShutDown)
}

/// Gives the executor one turn, for a caller waiting on a full inbox.
struct YieldNow(bool);

impl Future for YieldNow {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            Poll::Ready(())
        } else {
            self.0 = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

/// A reply channel for `n` answers, for the broker's calls to every shard at once.
pub(crate) fn fan_in(n: usize) -> (impl Fn() -> ReplyTo, Receiver<Answer>) {
    let (tx, rx) = bounded(n);
    (move || ReplyTo::channel(tx.clone()), rx)
}
