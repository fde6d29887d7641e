//! The connection's clocks without a socket: the handshake's deadline, heartbeats sent
//! and missed, a peer that takes nothing, and a close's grace. Times are made up from one
//! reading of the clock, so nothing here waits.

use std::time::Instant;

use super::*;
use crate::connection::TimedOut;

/// A connection through the handshake whose client asked for heartbeats every
/// `heartbeat` seconds, and the time it was made at (at most that: it read the clock
/// itself, a moment before).
fn open_with_heartbeat(heartbeat: u16) -> (Client, Instant) {
    let mut c = Client::new(Settings::default());
    let made = Instant::now();
    c.feed(&[AMQPFrame::ProtocolHeader(ProtocolVersion::amqp_0_9_1())]);
    c.feed(&[start_ok("guest", "guest")]);
    let mut frames = open_frames();
    frames[0] = conn_method(connection::AMQPMethod::TuneOk(connection::TuneOk {
        channel_max: 16,
        frame_max: 8192,
        heartbeat,
    }));
    let out = c.feed(&frames);
    assert_eq!(out.len(), 2, "open-ok and channel open-ok: {out:?}");
    (c, made)
}

#[test]
fn a_client_not_through_the_handshake_in_time_is_timed_out() {
    let mut c = Client::new(Settings {
        handshake_timeout: Duration::from_secs(10),
        ..Settings::default()
    });
    let now = Instant::now();
    let due = c.conn.poll_timeout(now).expect("the handshake's deadline");
    assert!(due <= now + Duration::from_secs(10), "{:?}", due - now);
    assert!(due + Duration::from_secs(1) > now + Duration::from_secs(10));
    assert_eq!(
        c.conn.handle_timeout(due - Duration::from_millis(1), 0),
        Ok(())
    );
    assert_eq!(c.conn.handle_timeout(due, 0), Err(TimedOut::Handshake));

    // Through the handshake, with no heartbeat asked for, nothing is ever due.
    let mut c = Client::open();
    assert_eq!(c.conn.poll_timeout(Instant::now()), None);
    let later = Instant::now() + Duration::from_secs(3600);
    assert_eq!(c.conn.handle_timeout(later, 0), Ok(()));
}

#[test]
fn a_quiet_connection_beats_every_half_interval_and_a_silent_peer_is_timed_out() {
    let (mut c, made) = open_with_heartbeat(2);
    // The first beat is due a second (half the interval) after the socket last took
    // bytes; nothing was written here, so a second after the connection was made.
    let due = c.conn.poll_timeout(made).expect("a heartbeat");
    assert!(due <= made + Duration::from_secs(1));
    assert_eq!(c.conn.handle_timeout(due, 0), Ok(()));
    let mut out = Vec::new();
    c.conn.take_output(&mut out);
    assert_eq!(decode(&out), [AMQPFrame::Heartbeat]);
    // The next one a second after that.
    let next = c.conn.poll_timeout(due).expect("the next heartbeat");
    assert_eq!(next, due + Duration::from_secs(1));
    // Output waiting for the socket: no heartbeat behind it.
    assert_eq!(c.conn.handle_timeout(next, 100), Ok(()));
    c.conn.take_output(&mut out);
    assert_eq!(decode(&out), [AMQPFrame::Heartbeat]);

    // Heard from the peer at `next`: not late at the beat two intervals after that, late
    // at the one after it (the peer's silence is looked at when a beat is due).
    c.conn.on_read(next);
    c.conn.on_written(next);
    let at = next + Duration::from_secs(4);
    assert_eq!(c.conn.handle_timeout(at, 0), Ok(()));
    assert_eq!(c.conn.poll_timeout(at), Some(at + Duration::from_secs(1)));
    let later = at + Duration::from_secs(1);
    assert_eq!(
        c.conn.handle_timeout(later, 0),
        Err(TimedOut::MissedHeartbeats)
    );
}

#[test]
fn a_peer_that_takes_nothing_for_two_intervals_is_timed_out_though_reading_paused() {
    let (mut c, made) = open_with_heartbeat(1);
    // Output waits and reading pauses (so the peer's silence is not held against it),
    // but the socket takes nothing.
    let mut now = made;
    for _ in 0..3 {
        now += Duration::from_millis(500);
        c.conn.reading_paused(now);
        assert_eq!(c.conn.handle_timeout(now, 1000), Ok(()));
    }
    // Two intervals and more since the socket last took anything (the connection was
    // made a moment before `made`).
    now += Duration::from_millis(1000);
    c.conn.reading_paused(now);
    assert_eq!(
        c.conn.handle_timeout(now, 1000),
        Err(TimedOut::PeerTookNothing)
    );
}

#[test]
fn a_close_waits_its_grace_for_close_ok_and_less_at_a_shutdown() {
    for (forced, grace) in [(false, 5), (true, 1)] {
        let mut c = Client::open();
        if forced {
            c.conn.force_close();
        } else {
            // A channel method on channel 0 is a connection error: the server closes.
            let out = c.feed(&[method(
                0,
                AMQPClass::Channel(channel::AMQPMethod::Flow(channel::Flow { active: true })),
            )]);
            assert_eq!(connection_close_code(&out), Some(504), "{out:?}");
        }
        assert!(c.conn.is_closing());
        let now = Instant::now();
        let by = c.conn.poll_timeout(now).expect("the close's grace");
        assert_eq!(by, now + Duration::from_secs(grace));
        // Asked again later, the grace still ends where it did.
        assert_eq!(
            c.conn.poll_timeout(now + Duration::from_millis(10)),
            Some(by)
        );
        let before = by - Duration::from_millis(1);
        assert_eq!(c.conn.handle_timeout(before, 0), Ok(()));
        assert_eq!(c.conn.handle_timeout(by, 0), Err(TimedOut::CloseGrace));
    }
}
