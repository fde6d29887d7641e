"""TLS, authentication, virtual hosts and permissions, against a running broker.

The broker must have been started from the files security_fixtures.py writes (its TLS
certificate and key, and its definitions.json); security_rabbitmq.sh does that for RabbitMQ
and for leasemqd. The tests read:

- SEC_DIR: the fixtures directory (ca.pem, passwords.json, …); without it every test is
  skipped;
- SEC_HOST: the broker's address (default 127.0.0.1);
- SEC_PORT: its plain AMQP port (default 5672);
- SEC_TLS_PORT: its AMQPS port (default 5671).

What the tests rely on from the definitions: the vhosts `/` and `sec-vhost`; the user `admin`
(every permission on both), `limited` (on sec-vhost only: configure `^limited-`, write
`^(limited-|amq\\.default$)`, read `^limited-`), `rootonly` (everything on `/` only) and
`servernamed` (on sec-vhost, only server-named `amq.gen-…` queues); `sha512user` and
`defaulthash` (everything on `/`; a SHA-512 hash, and a hash without hashing_algorithm) and
`nopassword` (an empty hash); and in sec-vhost the durable queue `limited-preset`, bound to the topic exchange `limited-events` by
`preset.#`. Each test makes its own resources under fresh names, so the tests do not depend
on one another, nor on running against a fresh broker.
"""

import json
import os
import re
import socket
import ssl
import uuid

import pika
import pytest

SEC_DIR = os.environ.get("SEC_DIR")
HOST = os.environ.get("SEC_HOST", "127.0.0.1")
PORT = int(os.environ.get("SEC_PORT", "5672"))
TLS_PORT = int(os.environ.get("SEC_TLS_PORT", "5671"))
SEC_VHOST = "sec-vhost"

pytestmark = pytest.mark.skipif(
    not SEC_DIR, reason="SEC_DIR is not set: no broker started from the security fixtures"
)

# The AMQP 0-9-1 protocol header, as a client opens a plain connection with it.
AMQP_HEADER = b"AMQP\x00\x00\x09\x01"


def fixture_path(name):
    return os.path.join(SEC_DIR, name)


def password(user):
    with open(fixture_path("passwords.json")) as f:
        return json.load(f)[user]


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def tls_context():
    """A client context that trusts the fixtures' CA only and checks the server's name."""
    context = ssl.create_default_context(cafile=fixture_path("ca.pem"))
    assert context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    return context


def params(user, vhost="/", tls=False, secret=None):
    """Connection parameters for `user` on `vhost`, over TLS (to the name `localhost`) or
    plain AMQP. `secret` replaces the user's password."""
    credentials = pika.PlainCredentials(
        user, password(user) if secret is None else secret, erase_on_connect=False
    )
    extra = {}
    if tls:
        extra["ssl_options"] = pika.SSLOptions(tls_context(), server_hostname="localhost")
    return pika.ConnectionParameters(
        host=HOST,
        port=TLS_PORT if tls else PORT,
        virtual_host=vhost,
        credentials=credentials,
        connection_attempts=1,
        socket_timeout=10,
        stack_timeout=20,
        **extra,
    )


def connect(user="admin", vhost="/", tls=False, secret=None):
    return pika.BlockingConnection(params(user, vhost, tls, secret))


# pika reports a connection.close received before the connection is open (a refused login
# or vhost) as ProbableAuthenticationError or ProbableAccessDeniedError, whose argument is the
# repr of the ConnectionClosedByBroker it stands for: "ConnectionClosedByBroker: (403) '…'".
CLOSED_BY_BROKER = re.compile(r"^ConnectionClosedByBroker: \((\d+)\) (['\"])(.*)\2$", re.S)


def refusal(open_connection):
    """(reply code, reply text) of the connection.close with which the broker refuses the
    connection `open_connection()` opens. A socket closed without connection.close fails."""
    with pytest.raises(pika.exceptions.AMQPConnectionError) as raised:
        open_connection().close()
    error = raised.value
    if isinstance(error, pika.exceptions.ConnectionClosedByBroker):
        return error.reply_code, error.reply_text
    if isinstance(
        error,
        (pika.exceptions.ProbableAuthenticationError, pika.exceptions.ProbableAccessDeniedError),
    ):
        match = CLOSED_BY_BROKER.match(str(error.args[0]) if error.args else "")
        if match:
            return int(match.group(1)), match.group(3)
    pytest.fail(f"the broker refused the connection without connection.close: {error!r}")


def refused_connection(user, vhost="/", tls=False, secret=None):
    """(reply code, reply text) of the broker's refusal to open this connection."""
    return refusal(lambda: connect(user, vhost, tls, secret))


def get_one(channel, queue):
    """The body of the next message ready in `queue` (auto-acked), or None."""
    method, _, body = channel.basic_get(queue=queue, auto_ack=True)
    return None if method is None else body


def drain(channel, queue):
    """The bodies of every message ready in `queue`, taken with auto_ack, in order."""
    bodies = []
    while (body := get_one(channel, queue)) is not None:
        bodies.append(body)
    return bodies


# RabbitMQ's reply text for a refused login, whatever the reason (unknown user, wrong
# password), so that it tells a client nothing about which.
LOGIN_REFUSED = (
    "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
    "For details see the broker logfile."
)


def access_refused_text(kind, name, user="limited", vhost=SEC_VHOST):
    """RabbitMQ's reply text for a permission refusal on a queue or exchange."""
    return f"ACCESS_REFUSED - access to {kind} '{name}' in vhost '{vhost}' refused for user '{user}'"


def assert_access_refused(closed, kind, name):
    """`closed` is a 403 channel close refusing `limited` access to the `kind` `name`."""
    assert isinstance(closed, pika.exceptions.ChannelClosedByBroker), closed
    assert closed.reply_code == 403, closed
    assert closed.reply_text == access_refused_text(kind, name)


def round_trip(channel):
    """A synchronous call with no permission check (basic.qos), so that an asynchronous
    method sent before it (basic.publish) has been handled, or refused, by its answer."""
    channel.basic_qos(prefetch_count=0)


# --- fixtures ------------------------------------------------------------------------------


@pytest.fixture
def limited():
    """A connection of `limited` on sec-vhost with a queue of its own (`limited-…`), and a
    second channel that must keep working while the first is refused something."""
    conn = connect("limited", SEC_VHOST)
    side = conn.channel()
    own = unique("limited-own")
    side.queue_declare(queue=own)
    yield conn, side, own
    if conn.is_open:
        cleanup = conn.channel()
        cleanup.queue_delete(queue=own)
        conn.close()


@pytest.fixture
def admin_queue():
    """A queue in sec-vhost that `limited` has no permission on, holding one message."""
    name = unique("admin-only")
    conn = connect("admin", SEC_VHOST)
    ch = conn.channel()
    ch.queue_declare(queue=name)
    # With publisher confirms the message is in the queue once basic_publish returns.
    ch.confirm_delivery()
    ch.basic_publish(exchange="", routing_key=name, body=b"for admin only")
    yield name
    ch.queue_delete(queue=name)
    conn.close()


def assert_still_serves(conn, side, own):
    """After a channel error, the connection is open, its other channel still works and a new
    channel can be opened: a message goes through the default exchange to `own` and back."""
    assert conn.is_open
    body = uuid.uuid4().hex.encode()
    side.basic_publish(exchange="", routing_key=own, body=body)
    assert drain(side, own) == [body]
    fresh = conn.channel()
    fresh.queue_declare(queue=own, passive=True)
    fresh.close()


# --- TLS -----------------------------------------------------------------------------------


def test_a_client_trusting_the_ca_publishes_and_consumes_over_tls():
    conn = connect("admin", "/", tls=True)
    ch = conn.channel()
    queue = unique("tls")
    ch.queue_declare(queue=queue)
    ch.basic_publish(exchange="", routing_key=queue, body=b"over tls")

    got = []

    def on_message(channel, method, _properties, body):
        got.append(body)
        channel.basic_ack(method.delivery_tag)
        channel.stop_consuming()

    ch.basic_consume(queue=queue, on_message_callback=on_message)
    conn.call_later(10, ch.stop_consuming)
    ch.start_consuming()
    assert got == [b"over tls"]
    ch.queue_delete(queue=queue)
    conn.close()


def test_the_tls_port_presents_the_fixtures_server_certificate():
    with open(fixture_path("server.pem")) as f:
        expected = ssl.PEM_cert_to_DER_cert(f.read())
    with socket.create_connection((HOST, TLS_PORT), timeout=10) as raw:
        with tls_context().wrap_socket(raw, server_hostname="localhost") as tls:
            assert tls.getpeercert(binary_form=True) == expected


def test_a_client_not_trusting_the_ca_rejects_the_tls_port():
    # The system's trust store, without the fixtures' CA: the broker's certificate does
    # not verify.
    context = ssl.create_default_context()
    with socket.create_connection((HOST, TLS_PORT), timeout=10) as raw:
        with pytest.raises(ssl.SSLCertVerificationError):
            context.wrap_socket(raw, server_hostname="localhost")


def test_plain_amqp_sent_to_the_tls_port_is_disconnected():
    with socket.create_connection((HOST, TLS_PORT), timeout=15) as raw:
        raw.sendall(AMQP_HEADER)
        received = b""
        try:
            while chunk := raw.recv(4096):
                received += chunk
        except ConnectionResetError:
            pass
        except socket.timeout:
            pytest.fail(f"the TLS port kept a plain AMQP client connected; it sent {received!r}")
    # Whatever came back (a TLS alert at most) is no AMQP: neither a protocol header nor a
    # connection.start method frame.
    assert not received.startswith(b"AMQP"), received
    assert not received.startswith(b"\x01\x00\x00"), received

    # The listener is unharmed: a TLS client connects after it.
    conn = connect("admin", "/", tls=True)
    assert conn.channel().is_open
    conn.close()


def test_the_plain_port_serves_the_same_users():
    conn = connect("admin", "/")
    ch = conn.channel()
    queue = unique("plain")
    ch.queue_declare(queue=queue)
    ch.basic_publish(exchange="", routing_key=queue, body=b"plain")
    assert drain(ch, queue) == [b"plain"]
    ch.queue_delete(queue=queue)
    conn.close()


# --- authentication ------------------------------------------------------------------------


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_a_wrong_password_is_refused(tls):
    code, text = refused_connection("admin", "/", tls=tls, secret=password("admin") + "-wrong")
    assert (code, text) == (403, LOGIN_REFUSED)


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_an_unknown_user_is_refused(tls):
    parameters = params("admin", "/", tls=tls)
    parameters.credentials = pika.PlainCredentials("nobody", "whatever")
    code, text = refusal(lambda: pika.BlockingConnection(parameters))
    assert (code, text) == (403, LOGIN_REFUSED)


def test_every_user_of_the_definitions_logs_in_with_its_password():
    for user, vhost in (("admin", "/"), ("admin", SEC_VHOST), ("limited", SEC_VHOST),
                        ("rootonly", "/")):
        conn = connect(user, vhost)
        assert conn.channel().is_open, (user, vhost)
        conn.close()


@pytest.mark.parametrize("user", ["sha512user", "defaulthash"])
def test_users_in_the_files_other_hash_forms_log_in(user):
    # sha512user: rabbit_password_hashing_sha512 and tags as one string; defaulthash: no
    # hashing_algorithm, so SHA-256.
    conn = connect(user, "/")
    assert conn.channel().is_open
    conn.close()
    code, text = refused_connection(user, "/", secret=password(user) + "-wrong")
    assert (code, text) == (403, LOGIN_REFUSED)


@pytest.mark.parametrize("secret", ["", "anything"], ids=["empty", "any"])
def test_a_user_with_an_empty_password_hash_cannot_log_in(secret):
    code, text = refused_connection("nopassword", "/", secret=secret)
    assert (code, text) == (403, LOGIN_REFUSED)


# --- virtual hosts -------------------------------------------------------------------------


def test_opening_an_unknown_vhost_is_refused():
    code, text = refused_connection("admin", "no-such-vhost")
    assert (code, text) == (530, "NOT_ALLOWED - vhost no-such-vhost not found")


@pytest.mark.parametrize(
    "user, vhost", [("rootonly", SEC_VHOST), ("limited", "/")], ids=["rootonly", "limited"]
)
def test_opening_a_vhost_without_permissions_on_it_is_refused(user, vhost):
    code, text = refused_connection(user, vhost)
    assert (code, text) == (530, f"NOT_ALLOWED - access to vhost '{vhost}' refused for user '{user}'")


def test_vhosts_hold_separate_queues_under_the_same_name():
    name = unique("same-name")
    root = connect("admin", "/")
    sec = connect("admin", SEC_VHOST)
    root_ch, sec_ch = root.channel(), sec.channel()
    root_ch.queue_declare(queue=name)
    sec_ch.queue_declare(queue=name)
    root_ch.basic_publish(exchange="", routing_key=name, body=b"in /")
    sec_ch.basic_publish(exchange="", routing_key=name, body=b"in sec-vhost 1")
    sec_ch.basic_publish(exchange="", routing_key=name, body=b"in sec-vhost 2")
    round_trip(root_ch)
    round_trip(sec_ch)

    assert root_ch.queue_declare(queue=name, passive=True).method.message_count == 1
    assert sec_ch.queue_declare(queue=name, passive=True).method.message_count == 2
    assert drain(root_ch, name) == [b"in /"]
    assert drain(sec_ch, name) == [b"in sec-vhost 1", b"in sec-vhost 2"]

    # Deleting one leaves the other.
    root_ch.queue_delete(queue=name)
    sec_ch.queue_declare(queue=name, passive=True)
    sec_ch.queue_delete(queue=name)
    root.close()
    sec.close()


def test_an_exchange_declared_in_one_vhost_is_not_found_in_the_other():
    name = unique("only-in-root")
    root = connect("admin", "/")
    root_ch = root.channel()
    root_ch.exchange_declare(exchange=name, exchange_type="direct")

    sec = connect("admin", SEC_VHOST)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        sec.channel().exchange_declare(exchange=name, passive=True)
    assert closed.value.reply_code == 404, closed.value
    # A queue of `/` is not found in sec-vhost either.
    queue = unique("only-in-root")
    root_ch.queue_declare(queue=queue)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        sec.channel().queue_declare(queue=queue, passive=True)
    assert closed.value.reply_code == 404, closed.value
    assert sec.is_open

    root_ch.exchange_delete(exchange=name)
    root_ch.queue_delete(queue=queue)
    root.close()
    sec.close()


def test_the_definitions_topology_exists_in_sec_vhost():
    conn = connect("admin", SEC_VHOST)
    ch = conn.channel()
    # Redeclaring with the same properties succeeds only if the type and durability match:
    # a mismatch is a 406.
    ch.exchange_declare(exchange="limited-events", exchange_type="topic", durable=True)
    ch.queue_declare(queue="limited-preset", durable=True)

    body = uuid.uuid4().hex.encode()
    ch.basic_publish(exchange="limited-events", routing_key="preset.x", body=body)
    round_trip(ch)
    assert body in drain(ch, "limited-preset")
    # A key the binding does not match reaches nothing.
    ch.basic_publish(exchange="limited-events", routing_key="other.x", body=b"unrouted")
    round_trip(ch)
    assert b"unrouted" not in drain(ch, "limited-preset")
    conn.close()


def test_the_definitions_topology_is_not_in_the_default_vhost():
    conn = connect("admin", "/")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        conn.channel().queue_declare(queue="limited-preset", passive=True)
    assert closed.value.reply_code == 404, closed.value
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        conn.channel().exchange_declare(exchange="limited-events", passive=True)
    assert closed.value.reply_code == 404, closed.value
    conn.close()


# --- permissions: what `limited` may do ----------------------------------------------------


def test_limited_declares_publishes_to_and_gets_from_its_own_queues(limited):
    conn, side, _own = limited
    ch = conn.channel()
    queue = unique("limited-x")
    ch.queue_declare(queue=queue)
    ch.basic_publish(exchange="", routing_key=queue, body=b"mine")
    assert drain(ch, queue) == [b"mine"]
    ch.queue_purge(queue=queue)
    ch.queue_delete(queue=queue)
    assert conn.is_open


def test_limited_binds_its_queue_to_its_exchange_and_publishes_through_it(limited):
    conn, side, own = limited
    ch = conn.channel()
    exchange = unique("limited-ex")
    ch.exchange_declare(exchange=exchange, exchange_type="topic")
    ch.queue_bind(queue=own, exchange=exchange, routing_key="mine.#")
    ch.basic_publish(exchange=exchange, routing_key="mine.1", body=b"routed")
    assert drain(ch, own) == [b"routed"]
    ch.queue_unbind(queue=own, exchange=exchange, routing_key="mine.#")
    ch.exchange_delete(exchange=exchange)
    assert conn.is_open


def test_limited_uses_the_queue_and_exchange_of_the_definitions(limited):
    conn, side, _own = limited
    ch = conn.channel()
    body = uuid.uuid4().hex.encode()
    ch.basic_publish(exchange="limited-events", routing_key="preset.limited", body=body)
    round_trip(ch)
    assert body in drain(ch, "limited-preset")


# --- permissions: what `limited` may not do ------------------------------------------------


def test_declaring_a_queue_outside_the_configure_pattern_is_refused(limited):
    conn, side, own = limited
    name = unique("other")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        conn.channel().queue_declare(queue=name)
    assert_access_refused(closed.value, "queue", name)
    assert_still_serves(conn, side, own)


def test_declaring_an_exchange_outside_the_configure_pattern_is_refused(limited):
    conn, side, own = limited
    name = unique("other-ex")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        conn.channel().exchange_declare(exchange=name, exchange_type="direct")
    assert_access_refused(closed.value, "exchange", name)
    assert_still_serves(conn, side, own)


def test_deleting_a_queue_outside_the_configure_pattern_is_refused(limited, admin_queue):
    conn, side, own = limited
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        conn.channel().queue_delete(queue=admin_queue)
    assert_access_refused(closed.value, "queue", admin_queue)
    assert_still_serves(conn, side, own)
    # The queue is still there, with its message.
    admin = connect("admin", SEC_VHOST)
    ok = admin.channel().queue_declare(queue=admin_queue, passive=True)
    assert ok.method.message_count == 1
    admin.close()


def test_deleting_an_exchange_outside_the_configure_pattern_is_refused(limited):
    conn, side, own = limited
    name = unique("admin-ex")
    admin = connect("admin", SEC_VHOST)
    admin_ch = admin.channel()
    admin_ch.exchange_declare(exchange=name, exchange_type="fanout")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        conn.channel().exchange_delete(exchange=name)
    assert_access_refused(closed.value, "exchange", name)
    assert_still_serves(conn, side, own)
    # The exchange is still there.
    admin_ch.exchange_declare(exchange=name, passive=True)
    admin_ch.exchange_delete(exchange=name)
    admin.close()


def test_publishing_to_an_exchange_without_write_permission_is_refused(limited):
    conn, side, own = limited
    ch = conn.channel()
    ch.basic_publish(exchange="amq.topic", routing_key="anything", body=b"refused")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        round_trip(ch)
    assert_access_refused(closed.value, "exchange", "amq.topic")
    assert_still_serves(conn, side, own)


def test_basic_get_on_a_queue_without_read_permission_is_refused(limited, admin_queue):
    conn, side, own = limited
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        conn.channel().basic_get(queue=admin_queue, auto_ack=True)
    assert_access_refused(closed.value, "queue", admin_queue)
    assert_still_serves(conn, side, own)


def test_basic_consume_on_a_queue_without_read_permission_is_refused(limited, admin_queue):
    conn, side, own = limited
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        conn.channel().basic_consume(queue=admin_queue, on_message_callback=lambda *a: None)
    assert_access_refused(closed.value, "queue", admin_queue)
    assert_still_serves(conn, side, own)


def test_purging_a_queue_without_read_permission_is_refused(limited, admin_queue):
    conn, side, own = limited
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        conn.channel().queue_purge(queue=admin_queue)
    assert_access_refused(closed.value, "queue", admin_queue)
    assert_still_serves(conn, side, own)
    admin = connect("admin", SEC_VHOST)
    ok = admin.channel().queue_declare(queue=admin_queue, passive=True)
    assert ok.method.message_count == 1
    admin.close()


def test_binding_a_queue_without_write_permission_is_refused(limited, admin_queue):
    conn, side, own = limited
    # Read on limited-events is granted; write on the queue is not.
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        conn.channel().queue_bind(queue=admin_queue, exchange="limited-events", routing_key="k")
    assert_access_refused(closed.value, "queue", admin_queue)
    assert_still_serves(conn, side, own)


def test_binding_to_an_exchange_without_read_permission_is_refused(limited):
    conn, side, own = limited
    # Write on the queue is granted; read on amq.topic is not.
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        conn.channel().queue_bind(queue=own, exchange="amq.topic", routing_key="k")
    assert_access_refused(closed.value, "exchange", "amq.topic")
    assert_still_serves(conn, side, own)


def test_unbinding_from_an_exchange_without_read_permission_is_refused(limited):
    conn, side, own = limited
    # queue.unbind needs what queue.bind needs: write on the queue, read on the exchange.
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        conn.channel().queue_unbind(queue=own, exchange="amq.topic", routing_key="k")
    assert_access_refused(closed.value, "exchange", "amq.topic")
    assert_still_serves(conn, side, own)


def test_a_refused_channel_leaves_the_other_channels_consuming(limited, admin_queue):
    conn, side, own = limited
    got = []
    side.basic_consume(
        queue=own, on_message_callback=lambda _c, _m, _p, body: got.append(body), auto_ack=True
    )
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        conn.channel().basic_get(queue=admin_queue)
    side.basic_publish(exchange="", routing_key=own, body=b"still delivered")
    for _ in range(100):
        if got:
            break
        conn.process_data_events(time_limit=0.1)
    assert got == [b"still delivered"]
    assert conn.is_open


def test_a_passive_declare_needs_no_configure_permission(limited, admin_queue):
    conn, side, own = limited
    ch = conn.channel()
    assert ch.queue_declare(queue=admin_queue, passive=True).method.message_count == 1
    ch.exchange_declare(exchange="amq.topic", passive=True)
    assert ch.is_open


def test_a_server_named_queue_in_a_vhost_gets_an_amq_gen_name():
    conn = connect("admin", SEC_VHOST)
    ch = conn.channel()
    name = ch.queue_declare(queue="", exclusive=True).method.queue
    assert name.startswith("amq.gen-"), name
    # The queue answers to that name.
    ch.basic_publish(exchange="", routing_key=name, body=b"to a server-named queue")
    assert drain(ch, name) == [b"to a server-named queue"]
    conn.close()


def test_a_user_allowed_amq_gen_names_declares_and_uses_a_server_named_queue():
    # `servernamed` may configure and read only `^amq\.gen-` in sec-vhost: the permission is
    # checked against the name the queue gets.
    conn = connect("servernamed", SEC_VHOST)
    ch = conn.channel()
    name = ch.queue_declare(queue="", exclusive=True).method.queue
    assert name.startswith("amq.gen-"), name
    ch.basic_publish(exchange="", routing_key=name, body=b"allowed")
    assert drain(ch, name) == [b"allowed"]
    ch.queue_delete(queue=name)
    conn.close()


def test_a_server_named_queue_is_checked_by_the_name_it_gets(limited):
    conn, side, own = limited
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        conn.channel().queue_declare(queue="", exclusive=True)
    assert closed.value.reply_code == 403, closed.value
    assert re.fullmatch(
        r"ACCESS_REFUSED - access to queue 'amq\.gen-[^']+' in vhost 'sec-vhost' "
        r"refused for user 'limited'",
        closed.value.reply_text,
    ), closed.value
    assert_still_serves(conn, side, own)


def test_an_empty_queue_name_is_checked_as_the_channels_last_declared_queue(
    limited, admin_queue
):
    conn, side, own = limited
    ch = conn.channel()
    # A passive declare (allowed) makes admin_queue the channel's last declared queue; a
    # basic.get of "" is then a basic.get of admin_queue, which `limited` may not read.
    ch.queue_declare(queue=admin_queue, passive=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ch.basic_get(queue="", auto_ack=True)
    assert_access_refused(closed.value, "queue", admin_queue)
    # And on a queue it may read, "" is that queue.
    mine = conn.channel()
    mine.queue_declare(queue=own, passive=True)
    side.basic_publish(exchange="", routing_key=own, body=b"via empty name")
    round_trip(side)
    method, _, body = mine.basic_get(queue="", auto_ack=True)
    assert method is not None and body == b"via empty name"


def test_a_dead_letter_exchange_without_write_permission_refuses_the_declare(limited):
    conn, side, own = limited
    name = unique("limited-dlx")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        conn.channel().queue_declare(
            queue=name, arguments={"x-dead-letter-exchange": "amq.topic"}
        )
    assert_access_refused(closed.value, "exchange", "amq.topic")
    assert_still_serves(conn, side, own)
    # With a dead-letter exchange it may write to, the same declare succeeds.
    ch = conn.channel()
    ch.queue_declare(queue=name, arguments={"x-dead-letter-exchange": "limited-events"})
    ch.queue_delete(queue=name)


def test_an_alternate_exchange_without_write_permission_refuses_the_declare(limited):
    conn, side, own = limited
    name = unique("limited-with-ae")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        conn.channel().exchange_declare(
            exchange=name, exchange_type="direct", arguments={"alternate-exchange": "amq.topic"}
        )
    assert_access_refused(closed.value, "exchange", "amq.topic")
    assert_still_serves(conn, side, own)
    # With an alternate exchange it may write to, the same declare succeeds.
    ch = conn.channel()
    ch.exchange_declare(
        exchange=name, exchange_type="direct", arguments={"alternate-exchange": "limited-events"}
    )
    ch.exchange_delete(exchange=name)


def test_exchange_bind_needs_read_on_the_source(limited):
    conn, side, own = limited
    ch = conn.channel()
    destination = unique("limited-dest")
    ch.exchange_declare(exchange=destination, exchange_type="fanout")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ch.exchange_bind(destination=destination, source="amq.topic", routing_key="#")
    assert_access_refused(closed.value, "exchange", "amq.topic")
    assert_still_serves(conn, side, own)
    # From a source it may read, the binding is made.
    ch = conn.channel()
    ch.exchange_bind(destination=destination, source="limited-events", routing_key="#")
    ch.exchange_unbind(destination=destination, source="limited-events", routing_key="#")
    ch.exchange_delete(exchange=destination)


def test_exchange_bind_needs_write_on_the_destination(limited):
    conn, side, own = limited
    destination = unique("admin-dest")
    admin = connect("admin", SEC_VHOST)
    admin_ch = admin.channel()
    admin_ch.exchange_declare(exchange=destination, exchange_type="fanout")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        conn.channel().exchange_bind(
            destination=destination, source="limited-events", routing_key="#"
        )
    assert_access_refused(closed.value, "exchange", destination)
    assert_still_serves(conn, side, own)
    admin_ch.exchange_delete(exchange=destination)
    admin.close()


# --- user_id -------------------------------------------------------------------------------


def test_a_publish_whose_user_id_is_not_the_connections_user_is_refused():
    conn = connect("admin", "/")
    side = conn.channel()
    queue = unique("user-id")
    side.queue_declare(queue=queue)
    ch = conn.channel()
    ch.basic_publish(
        exchange="",
        routing_key=queue,
        body=b"forged",
        properties=pika.BasicProperties(user_id="someone-else"),
    )
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        round_trip(ch)
    assert closed.value.reply_code == 406, closed.value
    assert closed.value.reply_text.startswith("PRECONDITION_FAILED"), closed.value
    # Nothing was enqueued, and the connection goes on.
    assert conn.is_open
    assert drain(side, queue) == []
    side.queue_delete(queue=queue)
    conn.close()


def test_a_publish_whose_user_id_is_the_connections_user_is_delivered_with_it():
    conn = connect("admin", "/")
    ch = conn.channel()
    queue = unique("user-id")
    ch.queue_declare(queue=queue)
    ch.basic_publish(
        exchange="",
        routing_key=queue,
        body=b"signed",
        properties=pika.BasicProperties(user_id="admin"),
    )
    method, properties, body = ch.basic_get(queue=queue, auto_ack=True)
    assert method is not None and body == b"signed"
    assert properties.user_id == "admin"
    ch.queue_delete(queue=queue)
    conn.close()
