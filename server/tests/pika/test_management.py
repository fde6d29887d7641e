"""The management HTTP API, rabbitmqadmin and the ctl (contract §11), against a running broker.

The broker must have been started from the files management_fixtures.py writes (its
definitions.json), with its management listener on; management_rabbitmq.sh does that for
RabbitMQ and for leasemqd. The tests read:

- MGMT_DIR: the fixtures directory (passwords.json, and a `scratch` folder that the ctl and
  the tests may both write); without it every test is skipped;
- MGMT_BROKER: `rabbitmq` or `leasemqd` (only /metrics differs: see its test);
- MGMT_HOST and MGMT_PORT: the broker's AMQP address (default 127.0.0.1:5672);
- MGMT_URL: the management listener's base URL (default http://127.0.0.1:15672);
- CTL: the ctl command line, to which each test appends a command and its arguments
  (`rabbitmqctl -n NODE -q`, or `leasemqctl --url URL --user admin`, which reads the password
  from LEASEMQCTL_PASSWORD); CTL_UNREACHABLE: the same ctl aimed at no broker;
- RABBITMQADMIN: the rabbitmqadmin script (default /usr/bin/rabbitmqadmin).

What the tests rely on from the definitions: the vhosts `/` and `orders`; the users `admin`
(tags administrator, every permission on both vhosts), `watcher` (monitoring; on `/` only,
configure `""`, write `""`, read `.*`), `manager` (management; everything on `orders` only)
and `plain` (no tags; everything on `/`); the durable queues `root-preset` in `/` and
`orders-preset` in `orders`. Each test makes its own resources under fresh names, so the
tests do not depend on one another, nor on running against a fresh broker.

RabbitMQ refreshes the figures the API reports (message counts, rates, a connection's
channels) every 5 seconds, so a test that reads them polls with a deadline (`eventually`)
rather than expecting them at once.
"""

import base64
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

import pika
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from management_fixtures import rabbit_password_hash  # noqa: E402

MGMT_DIR = os.environ.get("MGMT_DIR")
BROKER = os.environ.get("MGMT_BROKER", "rabbitmq")
HOST = os.environ.get("MGMT_HOST", "127.0.0.1")
PORT = int(os.environ.get("MGMT_PORT", "5672"))
URL = os.environ.get("MGMT_URL", "http://127.0.0.1:15672").rstrip("/")
CTL = shlex.split(os.environ.get("CTL", ""))
CTL_UNREACHABLE = shlex.split(os.environ.get("CTL_UNREACHABLE", ""))
RABBITMQADMIN = os.environ.get("RABBITMQADMIN", "/usr/bin/rabbitmqadmin")
ORDERS = "orders"

# How long the API may take to show what was just done over AMQP (RabbitMQ: up to ~5 s).
STATS_TIMEOUT_S = 15

pytestmark = pytest.mark.skipif(
    not MGMT_DIR, reason="MGMT_DIR is not set: no broker started from the management fixtures"
)

# RabbitMQ's refusal bodies, as clients match them.
NOT_MANAGEMENT = {"error": "not_authorised", "reason": "Not management user"}
NOT_ADMINISTRATOR = {"error": "not_authorised", "reason": "Not administrator user"}
NOT_IN_VHOST = {"error": "not_authorised", "reason": "User not authorised to access virtual host"}
ACCESS_REFUSED = {"error": "not_authorised", "reason": "Access refused."}
NOT_FOUND = {"error": "Object Not Found", "reason": "Not Found"}


# --- helpers: fixtures, names ---------------------------------------------------------------


def password(user):
    with open(os.path.join(MGMT_DIR, "passwords.json")) as f:
        return json.load(f)[user]


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def scratch(name):
    """A path in the fixtures' scratch folder, which the ctl (maybe another OS user) and the
    tests may both write and read."""
    return os.path.join(MGMT_DIR, "scratch", name)


def q(segment):
    """One path segment of the API: every reserved character percent-encoded (`/` is %2F)."""
    return urllib.parse.quote(segment, safe="")


# --- helpers: HTTP --------------------------------------------------------------------------


class Reply:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.body = body

    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        return f"<HTTP {self.status} {self.body[:300]!r}>"


def http(method, path, user="admin", body=None, raw=None, secret=None, headers=None):
    """One request to the management listener, with basic auth as `user` (none if `user` is
    None; `secret` replaces the user's password). `body` is sent as JSON, `raw` as is."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(URL + path, data=data, method=method)
    if user is not None:
        credentials = f"{user}:{password(user) if secret is None else secret}"
        token = base64.b64encode(credentials.encode()).decode()
        request.add_header("Authorization", "Basic " + token)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return Reply(response.status, response.headers, response.read().decode())
    except urllib.error.HTTPError as error:
        return Reply(error.code, error.headers, error.read().decode())


def get_json(path, user="admin"):
    reply = http("GET", path, user)
    assert reply.status == 200, (path, reply)
    return reply.json()


def assert_refused(reply, expected):
    """A 401 with exactly RabbitMQ's JSON refusal `expected`."""
    assert reply.status == 401, reply
    assert reply.json() == expected


def eventually(fetch, accept, what, timeout=STATS_TIMEOUT_S):
    """fetch() until accept(value) holds, and return that value; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if accept(value):
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"{what}: not within {timeout}s; last seen {value!r}")
        time.sleep(0.5)


def has_entry(entries, expected):
    """Whether one of the dicts `entries` holds every key and value of `expected` (a
    definitions file may carry more keys: rabbitmqctl's adds a queue's "type")."""
    return any(expected.items() <= entry.items() for entry in entries)


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def queue_path(name, vhost="/"):
    return f"/api/queues/{q(vhost)}/{q(name)}"


def queue_figures(name, vhost="/"):
    """The queue's detail, or {} while it is not found."""
    reply = http("GET", queue_path(name, vhost))
    return reply.json() if reply.status == 200 else {}


def publish_over_http(routing_key, payload, exchange="amq.default", vhost="/", properties=None,
                      encoding="string", user="admin"):
    return http(
        "POST",
        f"/api/exchanges/{q(vhost)}/{q(exchange)}/publish",
        user,
        body={
            "properties": properties or {},
            "routing_key": routing_key,
            "payload": payload,
            "payload_encoding": encoding,
        },
    )


def get_over_http(queue, ackmode, count=1, vhost="/", encoding="auto"):
    reply = http(
        "POST",
        f"/api/queues/{q(vhost)}/{q(queue)}/get",
        body={"count": count, "ackmode": ackmode, "encoding": encoding},
    )
    assert reply.status == 200, reply
    return reply.json()


def connections_named(connection_name, user="admin"):
    """The API's connections whose client said it is `connection_name`."""
    return [
        c
        for c in get_json("/api/connections", user)
        if (c.get("client_properties") or {}).get("connection_name") == connection_name
    ]


def wait_for_connection(connection_name):
    found = eventually(
        lambda: connections_named(connection_name),
        lambda cs: len(cs) == 1,
        f"connection {connection_name!r} in /api/connections",
    )
    return found[0]


# --- helpers: AMQP --------------------------------------------------------------------------


def connect_as(user, secret, vhost="/", name=None):
    """A pika connection of `user` with password `secret`, announcing itself as `name` (the
    client property connection_name) when given."""
    properties = {"connection_name": name} if name else None
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            host=HOST,
            port=PORT,
            virtual_host=vhost,
            credentials=pika.PlainCredentials(user, secret, erase_on_connect=False),
            client_properties=properties,
            connection_attempts=1,
            socket_timeout=10,
            stack_timeout=20,
        )
    )


def connect(user="admin", vhost="/", secret=None, name=None):
    """connect_as() a user of the fixtures, with its password unless `secret` replaces it."""
    return connect_as(user, password(user) if secret is None else secret, vhost, name)


def login_refused(user, vhost="/", secret=None):
    """True when the broker refuses `user`'s AMQP connection to `vhost`."""
    try:
        connect(user, vhost, secret).close()
    except pika.exceptions.AMQPConnectionError:
        return True
    return False


def ready_count(channel, queue):
    return channel.queue_declare(queue=queue, passive=True).method.message_count


def amqp_queue_exists(queue, vhost="/"):
    conn = connect("admin", vhost)
    try:
        conn.channel().queue_declare(queue=queue, passive=True)
        return True
    except pika.exceptions.ChannelClosedByBroker as closed:
        assert closed.reply_code == 404, closed
        return False
    finally:
        if conn.is_open:
            conn.close()


def wait_closed_by_broker(conn, timeout=10):
    """The ConnectionClosedByBroker that ends `conn` within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.2)
    except pika.exceptions.ConnectionClosedByBroker as closed:
        return closed
    pytest.fail("the broker did not close the connection")


@pytest.fixture
def amqp():
    """An admin connection and channel on `/`, with publisher confirms (a message is in its
    queue once basic_publish returns)."""
    conn = connect("admin", "/")
    ch = conn.channel()
    ch.confirm_delivery()
    yield conn, ch
    if conn.is_open:
        conn.close()


@pytest.fixture
def queue(amqp):
    """A fresh queue in `/`, deleted afterwards."""
    _, ch = amqp
    name = unique("mq")
    ch.queue_declare(queue=name)
    yield name
    http("DELETE", queue_path(name))


@pytest.fixture
def fresh_user():
    """A user of its own (tags none, everything on `/`), created over the API, deleted
    afterwards: (name, password)."""
    name, secret = unique("user"), uuid.uuid4().hex
    assert http("PUT", f"/api/users/{q(name)}", body={"password": secret, "tags": ""}).status == 201
    perms = {"configure": ".*", "write": ".*", "read": ".*"}
    assert http("PUT", f"/api/permissions/%2F/{q(name)}", body=perms).status == 201
    yield name, secret
    http("DELETE", f"/api/users/{q(name)}")


# --- helpers: rabbitmqadmin and the ctl -----------------------------------------------------


def rabbitmqadmin(*args, user="admin", secret=None):
    """Debian's rabbitmqadmin, pointed at the management listener."""
    parsed = urllib.parse.urlsplit(URL)
    command = [
        RABBITMQADMIN, "-H", parsed.hostname, "-P", str(parsed.port), "-u", user,
        "-p", password(user) if secret is None else secret, *args,
    ]
    # HOME: no ~/.rabbitmqadmin.conf of the machine's user is read.
    env = dict(os.environ, HOME=MGMT_DIR)
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)


def ctl(*args, prefix=None):
    """The ctl with `args`; its CompletedProcess (text)."""
    command = (prefix if prefix is not None else CTL) + list(args)
    assert command, "CTL is not set"
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def ctl_ok(*args):
    done = ctl(*args)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def ctl_table(*args):
    """The ctl's tab-separated output: (header, rows), each a list of fields. rabbitmqctl
    prints nothing at all, not even the header, for an empty list: ([], [])."""
    lines = ctl_ok(*args).splitlines()
    if not lines:
        return [], []
    table = [line.split("\t") for line in lines]
    header, rows = table[0], table[1:]
    for row in rows:
        assert len(row) == len(header), (args, header, row)
    return header, rows


def ctl_json(*args):
    return json.loads(ctl_ok(*args, "--formatter", "json"))


def ctl_table_with(row, *args):
    """ctl_table(*args) once its rows include `row` (rabbitmqctl reads live figures; a ctl
    that reads the API may lag as the API does)."""
    return eventually(lambda: ctl_table(*args), lambda table: row in table[1],
                      f"{row} in the ctl's {args}")


# --- overview, whoami -----------------------------------------------------------------------


def test_overview_carries_the_figures_monitoring_tools_read():
    overview = eventually(
        lambda: get_json("/api/overview"),
        # Right after boot RabbitMQ answers `"queue_totals": {}` until its first sample.
        lambda o: "messages" in o.get("queue_totals", {}),
        "queue_totals in /api/overview",
    )
    for key in ("rabbitmq_version", "management_version", "cluster_name", "node"):
        assert isinstance(overview[key], str) and overview[key], key
    for key in ("connections", "channels", "queues", "exchanges", "consumers"):
        assert isinstance(overview["object_totals"][key], int), key
    for key in ("messages", "messages_ready", "messages_unacknowledged"):
        assert isinstance(overview["queue_totals"][key], int), key
    assert isinstance(overview["message_stats"], dict)
    amqp_listeners = [l for l in overview["listeners"] if l["protocol"] == "amqp"]
    assert [l["port"] for l in amqp_listeners] == [PORT]


def test_overview_counts_a_new_connection_channel_and_consumer(amqp, queue):
    conn, ch = amqp
    ch.basic_consume(queue=queue, on_message_callback=lambda *a: None)
    totals = eventually(
        lambda: get_json("/api/overview")["object_totals"],
        lambda t: t["connections"] >= 1 and t["channels"] >= 1 and t["consumers"] >= 1,
        "object_totals counting the connection",
    )
    assert totals["queues"] >= 3  # root-preset, orders-preset and this test's queue
    # At least the default exchange and amq.direct, fanout, headers, match and topic of each
    # of the two vhosts.
    assert totals["exchanges"] >= 12


@pytest.mark.parametrize(
    "user, tags",
    [("admin", ["administrator"]), ("watcher", ["monitoring"]), ("manager", ["management"])],
)
def test_whoami_names_the_user_and_its_tags(user, tags):
    assert get_json("/api/whoami", user) == {"name": user, "tags": tags}


# --- authentication and tags ----------------------------------------------------------------


def test_a_request_without_credentials_is_401_with_a_basic_challenge():
    reply = http("GET", "/api/overview", user=None)
    assert reply.status == 401
    assert reply.headers["WWW-Authenticate"].startswith("Basic ")


@pytest.mark.parametrize("user", ["admin", "nobody"], ids=["wrong-password", "unknown-user"])
def test_a_failed_login_is_401_login_failed(user):
    reply = http("GET", "/api/overview", user, secret="wrong-password")
    assert reply.status == 401
    # RabbitMQ spells it "not_authorized" here, and "not_authorised" in its tag refusals.
    assert reply.json() == {"error": "not_authorized", "reason": "Login failed"}
    assert reply.headers["WWW-Authenticate"].startswith("Basic ")


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("GET", "/api/overview", None),
        ("GET", "/api/whoami", None),
        ("GET", "/api/queues", None),
        ("GET", "/api/queues/%2F/root-preset", None),
        ("PUT", "/api/queues/%2F/plain-made", {"durable": True}),
        ("GET", "/api/health/checks/alarms", None),
        ("GET", "/api/aliveness-test/%2F", None),
    ],
)
def test_a_user_without_a_management_tag_gets_401_not_management_user(method, path, body):
    # `plain` has every permission on `/` but no tag: AMQP only.
    assert_refused(http(method, path, "plain", body=body), NOT_MANAGEMENT)


@pytest.mark.parametrize("user", ["watcher", "manager"])
@pytest.mark.parametrize(
    "method, path, body",
    [
        ("GET", "/api/users", None),
        ("GET", "/api/users/admin", None),
        ("PUT", "/api/users/made-by-non-admin", {"password": "x", "tags": ""}),
        ("GET", "/api/permissions", None),
        ("PUT", "/api/permissions/%2F/plain", {"configure": ".*", "write": ".*", "read": ".*"}),
        ("GET", "/api/definitions", None),
        ("POST", "/api/definitions", {}),
        ("PUT", "/api/vhosts/made-by-non-admin", None),
        ("DELETE", "/api/vhosts/orders", None),
    ],
)
def test_administrator_only_resources_refuse_other_tags_with_401(user, method, path, body):
    assert_refused(http(method, path, user, body=body), NOT_ADMINISTRATOR)


def test_monitoring_reads_every_connection_channel_and_vhost():
    conn = connect("manager", ORDERS)
    try:
        conn.channel()
        users = eventually(
            lambda: [c["user"] for c in get_json("/api/connections", "watcher")],
            lambda us: "manager" in us,
            "manager's connection seen by watcher",
        )
        assert "manager" in users
        channels = eventually(
            lambda: get_json("/api/channels", "watcher"),
            lambda cs: any(c["user"] == "manager" for c in cs),
            "manager's channel seen by watcher",
        )
        assert any(c["vhost"] == ORDERS for c in channels)
    finally:
        conn.close()
    # Every vhost, even one it has no permission in.
    assert {v["name"] for v in get_json("/api/vhosts", "watcher")} >= {"/", ORDERS}


def test_monitoring_reads_queues_only_of_vhosts_it_has_permissions_in():
    names = {(x["vhost"], x["name"]) for x in get_json("/api/queues", "watcher")}
    assert ("/", "root-preset") in names
    assert not any(vhost == ORDERS for vhost, _ in names)
    assert {x["vhost"] for x in get_json("/api/exchanges", "watcher")} == {"/"}
    assert get_json("/api/queues/%2F/root-preset", "watcher")["name"] == "root-preset"
    assert_refused(http("GET", "/api/queues/orders", "watcher"), NOT_IN_VHOST)
    assert_refused(http("GET", "/api/queues/orders/orders-preset", "watcher"), NOT_IN_VHOST)


def test_monitoring_cannot_declare_where_its_configure_pattern_is_empty():
    # watcher's configure pattern on `/` is "", which matches no name.
    assert_refused(
        http("PUT", queue_path(unique("by-watcher")), "watcher", body={"durable": True}),
        ACCESS_REFUSED,
    )


def test_management_sees_only_the_vhosts_it_has_permissions_in():
    assert [v["name"] for v in get_json("/api/vhosts", "manager")] == [ORDERS]
    names = {(x["vhost"], x["name"]) for x in get_json("/api/queues", "manager")}
    assert (ORDERS, "orders-preset") in names
    assert not any(vhost == "/" for vhost, _ in names)
    assert {x["vhost"] for x in get_json("/api/exchanges", "manager")} == {ORDERS}
    assert_refused(http("GET", "/api/queues/%2F", "manager"), NOT_IN_VHOST)
    assert_refused(http("GET", "/api/queues/%2F/root-preset", "manager"), NOT_IN_VHOST)


def test_management_declares_in_its_vhost_but_not_in_others():
    name = unique("by-manager")
    assert http("PUT", queue_path(name, ORDERS), "manager", body={"durable": True}).status == 201
    assert_refused(
        http("PUT", queue_path(name), "manager", body={"durable": True}), NOT_IN_VHOST
    )
    assert http("DELETE", queue_path(name, ORDERS), "manager").status == 204


def test_management_sees_only_its_own_connections():
    other_name = unique("admins-own")
    mine = connect("manager", ORDERS)
    other = connect("admin", "/", name=other_name)
    try:
        wait_for_connection(other_name)
        users = eventually(
            lambda: {c["user"] for c in get_json("/api/connections", "manager")},
            lambda us: "manager" in us,
            "manager's own connection",
        )
        assert users == {"manager"}
    finally:
        mine.close()
        other.close()


def test_a_user_other_than_the_owner_or_an_administrator_cannot_close_a_connection():
    name = unique("not-yours")
    conn = connect("manager", ORDERS, name=name)
    try:
        found = wait_for_connection(name)
        reply = http("DELETE", f"/api/connections/{q(found['name'])}", "watcher")
        assert_refused(
            reply, {"error": "not_authorised", "reason": "User not authorised to access object"}
        )
        conn.process_data_events(time_limit=0.2)
        assert conn.is_open
    finally:
        conn.close()


# --- vhosts ---------------------------------------------------------------------------------


def test_a_vhost_is_created_201_then_204_and_deleted_204_then_404():
    assert {v["name"] for v in get_json("/api/vhosts")} >= {"/", ORDERS}
    name = unique("vh")
    assert http("PUT", f"/api/vhosts/{q(name)}").status == 201
    assert http("PUT", f"/api/vhosts/{q(name)}").status == 204
    assert get_json(f"/api/vhosts/{q(name)}")["name"] == name
    assert name in {v["name"] for v in get_json("/api/vhosts")}
    # RabbitMQ gives the user who created the vhost over the API every permission on it.
    assert get_json(f"/api/permissions/{q(name)}/admin") == {
        "user": "admin", "vhost": name, "configure": ".*", "write": ".*", "read": ".*"
    }
    conn = connect("admin", name)
    conn.channel().queue_declare(queue="in-new-vhost")
    conn.close()

    assert http("DELETE", f"/api/vhosts/{q(name)}").status == 204
    assert http("DELETE", f"/api/vhosts/{q(name)}").status == 404
    assert http("GET", f"/api/vhosts/{q(name)}").status == 404
    assert login_refused("admin", name)
    assert http("DELETE", "/api/vhosts/no-such-vhost").json() == NOT_FOUND


# --- queues ---------------------------------------------------------------------------------


def test_queues_lists_every_vhost_or_one():
    names = {(x["vhost"], x["name"]) for x in get_json("/api/queues")}
    assert {("/", "root-preset"), (ORDERS, "orders-preset")} <= names
    queues = get_json("/api/queues/orders")
    assert "orders-preset" in {x["name"] for x in queues}
    assert {x["vhost"] for x in queues} == {ORDERS}
    assert http("GET", "/api/queues/no-such-vhost").status == 404


def test_a_queue_reports_ready_unacked_consumers_and_rates(amqp):
    conn, ch = amqp
    name = unique("figures")
    ch.queue_declare(queue=name, durable=True, arguments={"x-max-length": 100})
    for i in range(5):
        ch.basic_publish(exchange="", routing_key=name, body=b"m%d" % i)
    # A consumer without auto-ack and a prefetch of 2 holds two messages unacknowledged.
    ch.basic_qos(prefetch_count=2)
    ch.basic_consume(queue=name, on_message_callback=lambda *a: None, consumer_tag="figures")
    conn.process_data_events(time_limit=0.2)

    detail = eventually(
        lambda: queue_figures(name),
        lambda d: (
            d.get("messages") == 5 and d.get("messages_ready") == 3
            and d.get("messages_unacknowledged") == 2 and d.get("consumers") == 1
            and d.get("message_stats", {}).get("publish") == 5
            and "deliver_get_details" in d.get("message_stats", {})
        ),
        f"figures of {name}",
    )
    assert detail["name"] == name and detail["vhost"] == "/"
    assert detail["durable"] is True
    assert detail["auto_delete"] is False
    assert detail["exclusive"] is False
    assert detail["arguments"] == {"x-max-length": 100}
    for key in ("messages", "messages_ready", "messages_unacknowledged", "consumers"):
        assert isinstance(detail[key], int), key
    # KEDA's MessageRate and DeliverGetRate modes read these rates.
    assert is_number(detail["message_stats"]["publish_details"]["rate"])
    assert is_number(detail["message_stats"]["deliver_get_details"]["rate"])
    ch.queue_delete(queue=name)


def test_a_queue_listing_carries_the_figures_flower_reads(amqp, queue):
    _, ch = amqp
    for _ in range(3):
        ch.basic_publish(exchange="", routing_key=queue, body=b"x")
    entry = eventually(
        lambda: {x["name"]: x for x in get_json("/api/queues/%2F")}.get(queue, {}),
        lambda x: x.get("messages") == 3,
        f"{queue} in /api/queues/%2F",
    )
    assert entry["messages_ready"] == 3
    assert entry["messages_unacknowledged"] == 0
    assert entry["consumers"] == 0
    assert entry["vhost"] == "/"


def test_a_regex_page_query_as_keda_sends_it(amqp, queue):
    _, ch = amqp
    ch.basic_publish(exchange="", routing_key=queue, body=b"x")
    path = (
        "/api/queues/%2F?page=1&use_regex=true&pagination=false&name="
        + urllib.parse.quote_plus(f"^{queue}$") + "&page_size=100"
    )
    page = eventually(
        lambda: get_json(path),
        lambda p: [i.get("messages") for i in p.get("items", [])] == [1],
        "a page of one matching queue",
    )
    assert [i["name"] for i in page["items"]] == [queue]
    assert page["page"] == 1 and page["filtered_count"] == 1 and page["item_count"] == 1


def test_the_columns_query_keeps_only_those_fields(queue):
    # rabbitmqadmin's `list queues name messages` asks for ?columns=name,messages.
    entries = get_json("/api/queues?columns=name,vhost")
    assert all(set(entry) <= {"name", "vhost"} for entry in entries)
    assert {"name": queue, "vhost": "/"} in entries
    detail = get_json(queue_path(queue) + "?columns=name,durable")
    assert detail == {"name": queue, "durable": False}


def test_put_queue_is_201_then_204_with_rabbitmqadmins_string_booleans():
    name = unique("put")
    # The body rabbitmqadmin sends for `declare queue name=... durable=true`.
    body = {"auto_delete": "false", "durable": "true", "arguments": {"x-max-length": 10},
            "name": name, "vhost": "/"}
    reply = http("PUT", queue_path(name), body=body)
    assert (reply.status, reply.body) == (201, "")
    assert http("PUT", queue_path(name), body=body).status == 204
    # JSON booleans declare the same queue.
    same = {"durable": True, "auto_delete": False, "arguments": {"x-max-length": 10}}
    assert http("PUT", queue_path(name), body=same).status == 204
    detail = get_json(queue_path(name))
    assert (detail["durable"], detail["auto_delete"]) == (True, False)
    assert detail["arguments"] == {"x-max-length": 10}
    conn = connect()
    ch = conn.channel()
    ch.queue_declare(queue=name, durable=True, arguments={"x-max-length": 10})
    ch.queue_delete(queue=name)
    conn.close()


def test_put_queue_with_other_properties_is_400_inequivalent():
    name = unique("inequivalent")
    assert http("PUT", queue_path(name), body={"durable": "true"}).status == 201
    reply = http("PUT", queue_path(name), body={"durable": "false"})
    assert reply.status == 400
    assert reply.json() == {
        "error": "bad_request",
        "reason": f"inequivalent arg 'durable' for queue '{name}' in vhost '/': "
                  "received 'false' but current is 'true'",
    }
    assert get_json(queue_path(name))["durable"] is True
    http("DELETE", queue_path(name))


@pytest.mark.parametrize(
    "raw", [b"{not json", b'{"durable": "maybe"}'], ids=["not-json", "durable-not-boolean"]
)
def test_put_queue_with_a_bad_body_is_400_with_a_reason(raw):
    name = unique("bad-body")
    reply = http("PUT", queue_path(name), raw=raw)
    assert reply.status == 400
    assert reply.json()["error"] == "bad_request"
    assert reply.json()["reason"]
    assert http("GET", queue_path(name)).status == 404


def test_put_queue_in_an_unknown_vhost_is_404():
    reply = http("PUT", queue_path("q", "no-such-vhost"), body={"durable": True})
    assert reply.status == 404
    assert reply.json() == {"error": "not_found", "reason": "vhost_not_found"}


def test_delete_queue_is_204_then_404(queue):
    assert http("DELETE", queue_path(queue)).status == 204
    reply = http("DELETE", queue_path(queue))
    assert reply.status == 404 and reply.json() == NOT_FOUND
    assert not amqp_queue_exists(queue)
    # So are a purge and a get of a queue that is not there.
    assert http("DELETE", queue_path(queue) + "/contents").status == 404
    reply = http("POST", queue_path(queue) + "/get",
                 body={"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"})
    assert reply.status == 404


def test_delete_queue_if_empty_refuses_a_queue_with_messages(amqp, queue):
    _, ch = amqp
    ch.basic_publish(exchange="", routing_key=queue, body=b"keep me")
    reply = http("DELETE", queue_path(queue) + "?if-empty=true")
    assert reply.status == 400
    assert reply.json() == {
        "error": "bad_request", "reason": f"queue '{queue}' in vhost '/' not empty"
    }
    assert ready_count(ch, queue) == 1


def test_delete_queue_if_unused_refuses_a_queue_with_a_consumer(amqp, queue):
    _, ch = amqp
    ch.basic_consume(queue=queue, on_message_callback=lambda *a: None)
    reply = http("DELETE", queue_path(queue) + "?if-unused=true")
    assert reply.status == 400
    assert reply.json() == {
        "error": "bad_request", "reason": f"queue '{queue}' in vhost '/' in use"
    }
    assert amqp_queue_exists(queue)


def test_deleting_a_queue_in_use_cancels_its_consumers(amqp, queue):
    conn, ch = amqp
    cancelled = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    ch.basic_consume(queue=queue, on_message_callback=lambda *a: None, consumer_tag="doomed")
    assert http("DELETE", queue_path(queue)).status == 204
    deadline = time.monotonic() + 10
    while not cancelled and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.2)
    # The consumer gets basic.cancel; its channel stays open.
    assert cancelled == ["doomed"]
    assert ch.is_open
    assert not amqp_queue_exists(queue)


def test_purge_removes_ready_messages_and_leaves_unacked_ones(amqp, queue):
    _, ch = amqp
    for i in range(4):
        ch.basic_publish(exchange="", routing_key=queue, body=b"p%d" % i)
    held, _, _ = ch.basic_get(queue=queue, auto_ack=False)
    reply = http("DELETE", queue_path(queue) + "/contents")
    assert (reply.status, reply.body) == (204, "")
    assert ready_count(ch, queue) == 0
    # The unacknowledged message was not purged: requeued, it is back (the requeue reaches the
    # queue asynchronously).
    ch.basic_nack(held.delivery_tag, requeue=True)
    eventually(lambda: ready_count(ch, queue), lambda n: n == 1, "the requeued message")


def test_another_connections_exclusive_queue_cannot_be_purged_deleted_or_read(amqp):
    _, ch = amqp
    name = ch.queue_declare(queue="", exclusive=True).method.queue
    ch.basic_publish(exchange="", routing_key=name, body=b"private")
    purge = http("DELETE", queue_path(name) + "/contents")
    assert purge.status == 400 and "exclusive access to locked queue" in purge.json()["reason"]
    delete = http("DELETE", queue_path(name))
    assert delete.status == 400 and "exclusive access to locked queue" in delete.json()["reason"]
    get = http("POST", queue_path(name) + "/get",
               body={"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"})
    assert get.status == 400 and "RESOURCE_LOCKED" in get.json()["reason"]
    assert ready_count(ch, name) == 1


# --- get -------------------------------------------------------------------------------------


def test_get_with_ack_requeue_true_peeks_and_marks_the_message_redelivered(amqp, queue):
    _, ch = amqp
    ch.basic_publish(exchange="", routing_key=queue, body=b"peek at me")
    ch.basic_publish(exchange="", routing_key=queue, body=b"second")
    [first] = get_over_http(queue, "ack_requeue_true")
    assert first == {
        "payload": "peek at me",
        "payload_bytes": 10,
        "payload_encoding": "string",
        "redelivered": False,
        "exchange": "",
        "routing_key": queue,
        "message_count": 1,
        # RabbitMQ writes a message without properties as an empty JSON array.
        "properties": first["properties"],
    }
    assert not first["properties"]
    [again] = get_over_http(queue, "ack_requeue_true")
    assert again["payload"] == "peek at me" and again["redelivered"] is True
    eventually(lambda: ready_count(ch, queue), lambda n: n == 2, "both messages back")
    method, _, body = ch.basic_get(queue=queue, auto_ack=True)
    assert body == b"peek at me" and method.redelivered


def test_get_with_ack_requeue_false_takes_count_messages(amqp, queue):
    _, ch = amqp
    for body in (b"one", b"two", b"three"):
        ch.basic_publish(exchange="", routing_key=queue, body=body)
    # rabbitmqadmin sends the count as a string.
    reply = http("POST", queue_path(queue) + "/get",
                 body={"count": "2", "ackmode": "ack_requeue_false", "encoding": "auto"})
    assert reply.status == 200
    taken = reply.json()
    assert [m["payload"] for m in taken] == ["one", "two"]
    # message_count: what is left in the queue after each message.
    assert [m["message_count"] for m in taken] == [2, 1]
    assert ready_count(ch, queue) == 1
    assert [m["payload"] for m in get_over_http(queue, "ack_requeue_false", count=5)] == ["three"]
    assert get_over_http(queue, "ack_requeue_false") == []


def test_get_reports_properties_and_base64_for_binary_payloads(amqp, queue):
    _, ch = amqp
    ch.basic_publish(
        exchange="", routing_key=queue, body=b"\x00\xffbinary",
        properties=pika.BasicProperties(
            content_type="application/octet-stream", delivery_mode=2, message_id="m-1",
            correlation_id="c-1", priority=3, headers={"h": "v", "n": 5},
        ),
    )
    ch.basic_publish(exchange="", routing_key=queue, body=b"text")
    binary, text = get_over_http(queue, "ack_requeue_true", count=2)
    assert binary["payload_encoding"] == "base64"
    assert base64.b64decode(binary["payload"]) == b"\x00\xffbinary"
    assert binary["payload_bytes"] == 8
    assert binary["properties"] == {
        "content_type": "application/octet-stream", "delivery_mode": 2, "message_id": "m-1",
        "correlation_id": "c-1", "priority": 3, "headers": {"h": "v", "n": 5},
    }
    assert (text["payload"], text["payload_encoding"]) == ("text", "string")
    # encoding base64 gives base64 whatever the payload.
    forced = get_over_http(queue, "ack_requeue_true", count=2, encoding="base64")
    assert [base64.b64decode(m["payload"]) for m in forced] == [b"\x00\xffbinary", b"text"]
    assert {m["payload_encoding"] for m in forced} == {"base64"}


@pytest.mark.parametrize("missing", ["count", "ackmode", "encoding"])
def test_get_without_a_required_field_is_400(queue, missing):
    body = {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}
    del body[missing]
    reply = http("POST", queue_path(queue) + "/get", body=body)
    assert reply.status == 400
    assert reply.json()["error"] == "bad_request"
    assert missing in reply.json()["reason"]


# --- exchanges and publish ------------------------------------------------------------------


def test_exchanges_list_the_default_and_the_amq_exchanges():
    exchanges = {(x["name"], x["type"]) for x in get_json("/api/exchanges/%2F")}
    assert {("", "direct"), ("amq.direct", "direct"), ("amq.fanout", "fanout"),
            ("amq.topic", "topic"), ("amq.headers", "headers"),
            ("amq.match", "headers")} <= exchanges
    everywhere = {(x["vhost"], x["name"]) for x in get_json("/api/exchanges")}
    assert {("/", ""), (ORDERS, ""), (ORDERS, "amq.topic")} <= everywhere
    # The default exchange answers to the name amq.default, as "".
    default = get_json("/api/exchanges/%2F/amq.default")
    assert (default["name"], default["type"], default["durable"]) == ("", "direct", True)


def test_put_exchange_is_201_then_204_400_inequivalent_and_delete_204_then_404():
    name = unique("ex")
    path = f"/api/exchanges/%2F/{q(name)}"
    # The body rabbitmqadmin sends for `declare exchange name=... type=topic`.
    body = {"auto_delete": "false", "durable": "true", "internal": "false", "arguments": {},
            "name": name, "type": "topic", "vhost": "/"}
    assert http("PUT", path, body=body).status == 201
    assert http("PUT", path, body=body).status == 204
    detail = get_json(path)
    assert (detail["name"], detail["type"], detail["durable"], detail["auto_delete"],
            detail["internal"]) == (name, "topic", True, False, False)
    reply = http("PUT", path, body={"type": "fanout", "durable": True})
    assert reply.status == 400
    assert reply.json() == {
        "error": "bad_request",
        "reason": f"inequivalent arg 'type' for exchange '{name}' in vhost '/': "
                  "received 'fanout' but current is 'topic'",
    }
    conn = connect()
    conn.channel().exchange_declare(exchange=name, exchange_type="topic", passive=True)
    conn.close()
    assert http("DELETE", path).status == 204
    assert http("DELETE", path).status == 404


def test_put_exchange_of_an_unknown_type_is_400():
    reply = http("PUT", f"/api/exchanges/%2F/{unique('ex')}", body={"type": "no-such-type"})
    assert reply.status == 400
    assert reply.json() == {
        "error": "bad_request", "reason": "unknown exchange type 'no-such-type'"
    }


def test_amq_exchanges_cannot_be_declared_or_deleted():
    assert_refused(http("PUT", "/api/exchanges/%2F/amq.made-up", body={"type": "direct"}),
                   ACCESS_REFUSED)
    assert_refused(http("DELETE", "/api/exchanges/%2F/amq.direct"), ACCESS_REFUSED)
    assert_refused(http("DELETE", "/api/exchanges/%2F/amq.default"), ACCESS_REFUSED)


def test_publish_through_the_default_exchange_reaches_the_queue(amqp, queue):
    _, ch = amqp
    reply = publish_over_http(
        queue, "over http",
        properties={"delivery_mode": 2, "content_type": "text/plain", "headers": {"k": "v"}},
    )
    assert reply.status == 200
    assert reply.json() == {"routed": True}
    method, properties, body = ch.basic_get(queue=queue, auto_ack=True)
    assert body == b"over http"
    assert method.exchange == "" and method.routing_key == queue
    assert properties.delivery_mode == 2
    assert properties.content_type == "text/plain"
    assert properties.headers == {"k": "v"}


def test_publish_with_a_base64_payload(amqp, queue):
    _, ch = amqp
    reply = publish_over_http(queue, base64.b64encode(b"\x01\x02bin").decode(), encoding="base64")
    assert reply.json() == {"routed": True}
    assert ch.basic_get(queue=queue, auto_ack=True)[2] == b"\x01\x02bin"


def test_publish_that_reaches_no_queue_says_routed_false():
    reply = publish_over_http(unique("no-such-queue"), "lost")
    assert reply.status == 200
    assert reply.json() == {"routed": False}
    # To an exchange that does not exist: 400, not 404.
    reply = publish_over_http("k", "lost", exchange="no-such-exchange")
    assert reply.status == 400
    assert reply.json()["error"] == "bad_request"


def test_publish_through_a_bound_exchange(amqp, queue):
    _, ch = amqp
    exchange = unique("pub-ex")
    ch.exchange_declare(exchange=exchange, exchange_type="direct")
    ch.queue_bind(queue=queue, exchange=exchange, routing_key="k1")
    assert publish_over_http("k1", "routed", exchange=exchange).json() == {"routed": True}
    assert publish_over_http("k2", "not routed", exchange=exchange).json() == {"routed": False}
    assert ch.basic_get(queue=queue, auto_ack=True)[2] == b"routed"
    assert ch.basic_get(queue=queue, auto_ack=True)[0] is None
    ch.exchange_delete(exchange=exchange)


# --- bindings -------------------------------------------------------------------------------


def test_a_binding_is_created_listed_used_and_deleted(amqp, queue):
    _, ch = amqp
    exchange = unique("bind-ex")
    ch.exchange_declare(exchange=exchange, exchange_type="direct")
    path = f"/api/bindings/%2F/e/{q(exchange)}/q/{q(queue)}"
    reply = http("POST", path, body={"routing_key": "rk-1", "arguments": {}})
    assert reply.status == 201
    # The Location names the new binding by its properties key.
    assert reply.headers["Location"].rstrip("/").rsplit("/", 1)[-1] == "rk-1"

    listed = get_json(path)
    assert listed == [{
        "source": exchange, "vhost": "/", "destination": queue, "destination_type": "queue",
        "routing_key": "rk-1", "arguments": {}, "properties_key": "rk-1",
    }]
    assert get_json(path + "/rk-1")["routing_key"] == "rk-1"
    everywhere = get_json("/api/bindings")
    assert any(b["source"] == exchange and b["destination"] == queue for b in everywhere)

    ch.basic_publish(exchange=exchange, routing_key="rk-1", body=b"bound")
    assert ch.basic_get(queue=queue, auto_ack=True)[2] == b"bound"

    assert http("DELETE", path + "/rk-1").status == 204
    assert http("DELETE", path + "/rk-1").status == 404
    assert get_json(path) == []
    ch.basic_publish(exchange=exchange, routing_key="rk-1", body=b"unbound")
    assert ch.basic_get(queue=queue, auto_ack=True)[0] is None
    ch.exchange_delete(exchange=exchange)


def test_the_bindings_list_shows_the_default_exchanges_binding(queue):
    bindings = get_json("/api/bindings/%2F")
    assert {
        "source": "", "vhost": "/", "destination": queue, "destination_type": "queue",
        "routing_key": queue, "arguments": {}, "properties_key": queue,
    } in bindings


def test_binding_to_an_unknown_exchange_or_queue_is_404(queue):
    assert http("POST", f"/api/bindings/%2F/e/no-such-exchange/q/{q(queue)}",
                body={"routing_key": "k"}).status == 404
    assert http("POST", "/api/bindings/%2F/e/amq.direct/q/no-such-queue",
                body={"routing_key": "k"}).status == 404


# --- connections, channels, consumers -------------------------------------------------------


def test_a_pika_connection_appears_with_its_fields():
    name = unique("pika-conn")
    conn = connect("admin", "/", name=name)
    try:
        conn.channel()
        found = eventually(
            lambda: connections_named(name),
            lambda cs: len(cs) == 1 and cs[0].get("channels") == 1,
            "the connection with one channel",
        )[0]
        assert (found["user"], found["vhost"]) == ("admin", "/")
        assert isinstance(found["name"], str) and found["name"]
        assert found["peer_host"] == "127.0.0.1"
        assert is_number(found["peer_port"]) and found["peer_port"] > 0
        assert found["client_properties"]["product"] == "Pika Python Client Library"
        assert found["client_properties"]["capabilities"]["consumer_cancel_notify"] is True
        detail = get_json(f"/api/connections/{q(found['name'])}")
        assert (detail["name"], detail["user"]) == (found["name"], "admin")
    finally:
        conn.close()


@pytest.mark.parametrize(
    "headers, reply_text",
    [
        ({}, "CONNECTION_FORCED - Closed via management plugin"),
        ({"X-Reason": "maintenance window"}, "CONNECTION_FORCED - maintenance window"),
    ],
    ids=["default-reason", "x-reason"],
)
def test_deleting_a_connection_closes_it_with_320(headers, reply_text):
    name = unique("doomed-conn")
    conn = connect("admin", "/", name=name)
    conn.channel()
    found = wait_for_connection(name)
    reply = http("DELETE", f"/api/connections/{q(found['name'])}", headers=headers)
    assert (reply.status, reply.body) == (204, "")
    closed = wait_closed_by_broker(conn)
    assert (closed.reply_code, closed.reply_text) == (320, reply_text)
    eventually(lambda: connections_named(name), lambda cs: cs == [], "the connection gone")
    assert http("DELETE", f"/api/connections/{q(found['name'])}").status == 404


def test_channels_list_shows_a_pika_channel(queue):
    name = unique("chan-conn")
    conn = connect("admin", "/", name=name)
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=4)
        ch.basic_consume(queue=queue, on_message_callback=lambda *a: None)
        conn_name = wait_for_connection(name)["name"]
        channel = eventually(
            lambda: [c for c in get_json("/api/channels")
                     if c.get("connection_details", {}).get("name") == conn_name],
            lambda cs: len(cs) == 1 and cs[0].get("consumer_count") == 1,
            "the channel in /api/channels",
        )[0]
        assert (channel["user"], channel["vhost"], channel["number"]) == ("admin", "/", 1)
        assert channel["prefetch_count"] == 4
        assert channel["messages_unacknowledged"] == 0
        assert isinstance(channel["name"], str)
        via_connection = get_json(f"/api/connections/{q(conn_name)}/channels")
        assert [c["name"] for c in via_connection] == [channel["name"]]
    finally:
        conn.close()


def test_consumers_list_shows_a_pika_consumer(queue):
    name = unique("cons-conn")
    conn = connect("admin", "/", name=name)
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=3)
        ch.basic_consume(queue=queue, on_message_callback=lambda *a: None, consumer_tag="c-tag-1")
        conn_name = wait_for_connection(name)["name"]
        consumer = eventually(
            lambda: [c for c in get_json("/api/consumers") if c["queue"]["name"] == queue],
            lambda cs: len(cs) == 1,
            "the consumer in /api/consumers",
        )[0]
        assert consumer["queue"] == {"name": queue, "vhost": "/"}
        assert consumer["consumer_tag"] == "c-tag-1"
        assert consumer["ack_required"] is True
        assert consumer["prefetch_count"] == 3
        assert consumer["exclusive"] is False
        assert consumer["channel_details"]["connection_name"] == conn_name
        assert consumer["channel_details"]["number"] == 1
        assert consumer["channel_details"]["user"] == "admin"
        per_vhost = [c for c in get_json("/api/consumers/%2F") if c["queue"]["name"] == queue]
        assert [c["consumer_tag"] for c in per_vhost] == ["c-tag-1"]
        detail = eventually(
            lambda: queue_figures(queue),
            lambda d: len(d.get("consumer_details", [])) == 1,
            "consumer_details of the queue",
        )
        assert detail["consumer_details"][0]["consumer_tag"] == "c-tag-1"
    finally:
        conn.close()


# --- users and permissions ------------------------------------------------------------------


def test_users_list_their_tags_and_password_hashes():
    users = {u["name"]: u for u in get_json("/api/users")}
    assert users["admin"]["tags"] == ["administrator"]
    assert users["watcher"]["tags"] == ["monitoring"]
    assert users["plain"]["tags"] == []
    assert users["admin"]["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    # base64 of a 4-byte salt and a SHA-256 digest.
    assert len(base64.b64decode(users["admin"]["password_hash"])) == 36
    assert get_json("/api/users/manager")["tags"] == ["management"]
    assert http("GET", "/api/users/no-such-user").status == 404


def test_a_user_created_over_the_api_logs_in_over_amqp():
    name, first, second = unique("api-user"), uuid.uuid4().hex, uuid.uuid4().hex
    path = f"/api/users/{q(name)}"
    # rabbitmqadmin sends the tags as one comma-separated string.
    body = {"password": first, "tags": "monitoring,management"}
    assert http("PUT", path, body=body).status == 201
    assert get_json(path)["tags"] == ["monitoring", "management"]
    perms = {"configure": ".*", "write": ".*", "read": ".*"}
    assert http("PUT", f"/api/permissions/%2F/{q(name)}", body=perms).status == 201
    connect_as(name, first).close()
    assert http("GET", "/api/whoami", name, secret=first).json() == {
        "name": name, "tags": ["monitoring", "management"]
    }

    # A PUT of an existing user replaces its password: 204.
    assert http("PUT", path, body={"password": second, "tags": ""}).status == 204
    connect_as(name, second).close()
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        connect_as(name, first)

    assert http("DELETE", path).status == 204
    assert http("DELETE", path).status == 404
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        connect_as(name, second)


def test_put_user_without_tags_is_400():
    reply = http("PUT", f"/api/users/{unique('no-tags')}", body={"password": "x"})
    assert reply.status == 400
    assert reply.json() == {"error": "bad_request", "reason": "tags_not_present"}


def test_permissions_list_and_read_one_entry():
    entries = get_json("/api/permissions")
    assert {"user": "watcher", "vhost": "/", "configure": "", "write": "", "read": ".*"} in entries
    assert {"user": "manager", "vhost": ORDERS, "configure": ".*", "write": ".*",
            "read": ".*"} in entries
    assert get_json("/api/permissions/%2F/watcher") == {
        "user": "watcher", "vhost": "/", "configure": "", "write": "", "read": ".*"
    }
    assert http("GET", "/api/permissions/orders/watcher").status == 404


def test_permissions_put_and_delete_govern_amqp_access():
    name, secret = unique("perm-user"), uuid.uuid4().hex
    assert http("PUT", f"/api/users/{q(name)}", body={"password": secret, "tags": ""}).status == 201
    path = f"/api/permissions/orders/{q(name)}"
    # No permission entry on orders: the vhost is refused.
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        connect_as(name, secret, ORDERS)

    body = {"configure": f"^{name}-", "write": ".*", "read": ".*"}
    assert http("PUT", path, body=body).status == 201
    assert http("PUT", path, body=body).status == 204
    assert get_json(path) == {"user": name, "vhost": ORDERS, **body}
    conn = connect_as(name, secret, ORDERS)
    ch = conn.channel()
    ch.queue_declare(queue=f"{name}-mine")
    ch.queue_delete(queue=f"{name}-mine")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        conn.channel().queue_declare(queue=unique("not-mine"))
    assert closed.value.reply_code == 403
    conn.close()

    assert http("DELETE", path).status == 204
    assert http("DELETE", path).status == 404
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        connect_as(name, secret, ORDERS)
    http("DELETE", f"/api/users/{q(name)}")


def test_an_empty_permission_pattern_allows_nothing():
    # watcher on `/`: configure "", write "", read ".*".
    conn = connect("watcher", "/")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        conn.channel().queue_declare(queue=unique("by-watcher"))
    assert closed.value.reply_code == 403
    ch = conn.channel()
    ch.basic_publish(exchange="", routing_key="root-preset", body=b"refused")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ch.basic_qos(prefetch_count=0)
    assert closed.value.reply_code == 403
    # Reading is allowed.
    reader = conn.channel()
    reader.queue_declare(queue="root-preset", passive=True)
    reader.basic_get(queue="root-preset", auto_ack=False)
    conn.close()
    # And over HTTP, a publish needs write permission on the exchange.
    reply = publish_over_http("root-preset", "refused", user="watcher")
    assert reply.status == 400
    assert "ACCESS_REFUSED" in reply.json()["reason"]


def test_bad_permission_puts_are_400():
    body = {"configure": ".*", "write": ".*", "read": ".*"}
    for path in ("/api/permissions/no-such-vhost/admin", "/api/permissions/%2F/no-such-user"):
        reply = http("PUT", path, body=body)
        assert reply.status == 400, path
        assert reply.json() == {"error": "bad_request", "reason": "vhost_or_user_not_found"}
    # Without every pattern.
    reply = http("PUT", "/api/permissions/%2F/plain", body={"configure": ".*"})
    assert reply.status == 400
    assert reply.json()["error"] == "bad_request"
    assert get_json("/api/permissions/%2F/plain")["write"] == ".*"


# --- definitions ----------------------------------------------------------------------------


def test_definitions_export_holds_every_section_and_a_declared_durable_queue(amqp):
    _, ch = amqp
    name = unique("exported")
    ch.queue_declare(queue=name, durable=True, arguments={"x-max-length": 7})
    exchange = unique("exported-ex")
    ch.exchange_declare(exchange=exchange, exchange_type="fanout", durable=True)
    ch.queue_bind(queue=name, exchange=exchange, routing_key="")
    exported = get_json("/api/definitions")
    for key in ("users", "vhosts", "permissions", "queues", "exchanges", "bindings"):
        assert isinstance(exported[key], list), key
    assert has_entry(exported["queues"], {"name": name, "vhost": "/", "durable": True,
                                          "auto_delete": False, "arguments": {"x-max-length": 7}})
    assert has_entry(exported["exchanges"], {"name": exchange, "vhost": "/", "type": "fanout",
                                             "durable": True, "auto_delete": False,
                                             "internal": False, "arguments": {}})
    assert has_entry(exported["bindings"], {"source": exchange, "vhost": "/", "destination": name,
                                            "destination_type": "queue", "routing_key": "",
                                            "arguments": {}})
    assert {"name": "/"} in exported["vhosts"] and {"name": ORDERS} in exported["vhosts"]
    users = {u["name"]: u for u in exported["users"]}
    assert users["watcher"]["tags"] == ["monitoring"]
    assert users["watcher"]["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    assert users["watcher"]["password_hash"]
    assert {"user": "manager", "vhost": ORDERS, "configure": ".*", "write": ".*",
            "read": ".*"} in exported["permissions"]
    # The default exchange and the amq.* ones are not exported.
    assert not any(x["name"] == "" or x["name"].startswith("amq.") for x in exported["exchanges"])
    ch.queue_delete(queue=name)
    ch.exchange_delete(exchange=exchange)


def test_definitions_import_creates_a_vhost_queue_user_and_permissions():
    vhost, queue_name, user = unique("imported-vh"), unique("imported-q"), unique("imported-u")
    secret = uuid.uuid4().hex
    document = {
        "users": [{"name": user, "password_hash": rabbit_password_hash(secret),
                   "hashing_algorithm": "rabbit_password_hashing_sha256",
                   "tags": ["management"], "limits": {}}],
        "vhosts": [{"name": vhost}],
        "permissions": [{"user": user, "vhost": vhost, "configure": ".*", "write": ".*",
                         "read": ".*"}],
        "queues": [{"name": queue_name, "vhost": vhost, "durable": True, "auto_delete": False,
                    "arguments": {}}],
        "exchanges": [], "bindings": [],
    }
    reply = http("POST", "/api/definitions", body=document)
    assert (reply.status, reply.body) == (204, "")
    assert get_json(queue_path(queue_name, vhost))["durable"] is True
    conn = connect_as(user, secret, vhost)
    conn.channel().queue_declare(queue=queue_name, durable=True, passive=True)
    conn.close()
    assert http("DELETE", f"/api/vhosts/{q(vhost)}").status == 204
    assert http("DELETE", f"/api/users/{q(user)}").status == 204


def test_definitions_import_of_bad_json_or_unknown_vhost_is_400():
    reply = http("POST", "/api/definitions", raw=b"{not json")
    assert reply.status == 400
    assert reply.json()["error"] == "bad_request" and reply.json()["reason"]
    name = unique("orphan")
    reply = http("POST", "/api/definitions", body={"queues": [
        {"name": name, "vhost": "no-such-vhost", "durable": True, "auto_delete": False,
         "arguments": {}}
    ]})
    assert reply.status == 400
    assert reply.json()["error"] == "bad_request"


# --- health, unknown paths, /metrics --------------------------------------------------------


@pytest.mark.parametrize("user", ["admin", "watcher", "manager"])
def test_health_check_alarms_is_ok(user):
    reply = http("GET", "/api/health/checks/alarms", user)
    assert reply.status == 200
    assert reply.json() == {"status": "ok"}


def test_aliveness_test_is_ok_in_each_vhost():
    for vhost in ("/", ORDERS):
        reply = http("GET", f"/api/aliveness-test/{q(vhost)}")
        assert (reply.status, reply.json()) == (200, {"status": "ok"}), vhost
    assert http("GET", "/api/aliveness-test/no-such-vhost").status == 404


@pytest.mark.parametrize(
    "path", ["/api/no-such-thing", "/api/exchanges/%2F/no-such-exchange", "/no/such/page",
             "/api/connections/no-such-connection", "/api/vhosts/no-such-vhost"]
)
def test_unknown_paths_are_404(path):
    reply = http("GET", path)
    assert reply.status == 404
    assert reply.json() == NOT_FOUND


def test_a_method_a_resource_does_not_have_is_405():
    assert http("POST", "/api/overview", body={}).status == 405
    assert http("POST", queue_path("root-preset"), body={}).status == 405


@pytest.mark.skipif(
    BROKER == "rabbitmq",
    reason="RabbitMQ 3.10 serves /metrics only from its prometheus plugin, on its own port",
)
def test_metrics_are_served_on_the_management_listener():
    reply = http("GET", "/metrics")
    assert reply.status == 200
    assert reply.headers["Content-Type"].startswith("text/plain")
    samples = [line for line in reply.body.splitlines() if line and not line.startswith("#")]
    assert samples
    sample = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*(\{.*\})? [-+0-9.eENaInf]+( -?\d+)?$")
    for line in samples:
        assert sample.match(line), line


# --- rabbitmqadmin --------------------------------------------------------------------------


def tsv(stdout):
    lines = stdout.splitlines()
    return [line.split("\t") for line in lines]


def test_rabbitmqadmin_declares_publishes_gets_purges_and_deletes_a_queue():
    name = unique("ra-q")
    done = rabbitmqadmin("declare", "queue", f"name={name}", "durable=true")
    assert (done.returncode, done.stdout.strip()) == (0, "queue declared"), done.stderr
    assert get_json(queue_path(name))["durable"] is True

    for payload in ("first", "second"):
        done = rabbitmqadmin("publish", f"routing_key={name}", f"payload={payload}")
        assert (done.returncode, done.stdout.strip()) == (0, "Message published"), done.stderr
    done = rabbitmqadmin("publish", f"routing_key={unique('nowhere')}", "payload=lost")
    assert (done.returncode, done.stdout.strip()) == (0, "Message published but NOT routed")

    def listed():
        rows = tsv(rabbitmqadmin("-f", "tsv", "list", "queues", "name", "messages").stdout)
        return rows

    rows = eventually(listed, lambda rows: [name, "2"] in rows, f"{name} with 2 messages listed")
    assert rows[0] == ["name", "messages"]

    done = rabbitmqadmin("-f", "raw_json", "get", f"queue={name}", "ackmode=ack_requeue_true")
    assert done.returncode == 0, done.stderr
    assert [m["payload"] for m in json.loads(done.stdout)] == ["first"]
    done = rabbitmqadmin("-f", "raw_json", "get", f"queue={name}", "ackmode=ack_requeue_false")
    [taken] = json.loads(done.stdout)
    assert (taken["payload"], taken["redelivered"], taken["message_count"]) == ("first", True, 1)

    done = rabbitmqadmin("purge", "queue", f"name={name}")
    assert (done.returncode, done.stdout.strip()) == (0, "queue purged"), done.stderr
    done = rabbitmqadmin("-f", "raw_json", "get", f"queue={name}", "ackmode=ack_requeue_false")
    assert json.loads(done.stdout) == []

    done = rabbitmqadmin("delete", "queue", f"name={name}")
    assert (done.returncode, done.stdout.strip()) == (0, "queue deleted"), done.stderr
    assert not amqp_queue_exists(name)


def test_rabbitmqadmin_declares_and_lists_exchanges_and_bindings(amqp):
    _, ch = amqp
    exchange, name = unique("ra-ex"), unique("ra-bound")
    ch.queue_declare(queue=name)
    done = rabbitmqadmin("declare", "exchange", f"name={exchange}", "type=topic")
    assert (done.returncode, done.stdout.strip()) == (0, "exchange declared"), done.stderr
    done = rabbitmqadmin("declare", "binding", f"source={exchange}", f"destination={name}",
                         "routing_key=orders.#")
    assert (done.returncode, done.stdout.strip()) == (0, "binding declared"), done.stderr

    exchanges = tsv(rabbitmqadmin("-f", "tsv", "list", "exchanges").stdout)
    assert exchanges[0] == ["name", "type"]
    assert [exchange, "topic"] in exchanges and ["amq.fanout", "fanout"] in exchanges
    bindings = tsv(rabbitmqadmin("-f", "tsv", "list", "bindings").stdout)
    assert bindings[0] == ["source", "destination", "routing_key"]
    assert [exchange, name, "orders.#"] in bindings

    done = rabbitmqadmin("publish", f"exchange={exchange}", "routing_key=orders.new",
                         "payload=via-topic")
    assert done.stdout.strip() == "Message published"
    assert ch.basic_get(queue=name, auto_ack=True)[2] == b"via-topic"

    # The binding's properties key, percent-encoded once more in the path by rabbitmqadmin.
    done = rabbitmqadmin("delete", "binding", f"source={exchange}", f"destination={name}",
                         "destination_type=queue", "properties_key=orders.%23")
    assert (done.returncode, done.stdout.strip()) == (0, "binding deleted"), done.stderr
    assert get_json(f"/api/bindings/%2F/e/{q(exchange)}/q/{q(name)}") == []
    done = rabbitmqadmin("delete", "exchange", f"name={exchange}")
    assert (done.returncode, done.stdout.strip()) == (0, "exchange deleted"), done.stderr
    ch.queue_delete(queue=name)


def test_rabbitmqadmin_manages_vhosts_users_and_permissions():
    vhost, user, secret = unique("ra-vh"), unique("ra-user"), uuid.uuid4().hex
    done = rabbitmqadmin("declare", "vhost", f"name={vhost}")
    assert (done.returncode, done.stdout.strip()) == (0, "vhost declared"), done.stderr
    done = rabbitmqadmin("declare", "user", f"name={user}", f"password={secret}",
                         "tags=management")
    assert (done.returncode, done.stdout.strip()) == (0, "user declared"), done.stderr
    done = rabbitmqadmin("declare", "permission", f"vhost={vhost}", f"user={user}",
                         "configure=.*", "write=.*", "read=.*")
    assert (done.returncode, done.stdout.strip()) == (0, "permission declared"), done.stderr

    vhosts = tsv(rabbitmqadmin("-f", "tsv", "list", "vhosts", "name").stdout)
    assert [vhost] in vhosts and ["/"] in vhosts
    users = tsv(rabbitmqadmin("-f", "tsv", "list", "users", "name", "tags").stdout)
    assert [user, "management"] in users and ["admin", "administrator"] in users

    conn = connect_as(user, secret, vhost)
    conn.channel().queue_declare(queue="ra-made")
    conn.close()
    queues = tsv(rabbitmqadmin("-V", vhost, "-f", "tsv", "list", "queues", "name").stdout)
    assert queues == [["name"], ["ra-made"]]

    assert rabbitmqadmin("delete", "user", f"name={user}").stdout.strip() == "user deleted"
    assert rabbitmqadmin("delete", "vhost", f"name={vhost}").stdout.strip() == "vhost deleted"
    assert http("GET", f"/api/vhosts/{q(vhost)}").status == 404


def test_rabbitmqadmin_lists_a_pika_connection():
    name = unique("ra-conn")
    conn = connect("manager", ORDERS, name=name)
    try:
        conn.channel()
        rows = eventually(
            lambda: tsv(rabbitmqadmin("-f", "tsv", "list", "connections").stdout),
            lambda rows: any(r[1:] == ["manager", "1"] for r in rows[1:]),
            "manager's connection with one channel in `rabbitmqadmin list connections`",
        )
        assert rows[0] == ["name", "user", "channels"]
    finally:
        conn.close()


def test_rabbitmqadmin_shows_the_overview():
    done = rabbitmqadmin("-f", "raw_json", "show", "overview")
    assert done.returncode == 0, done.stderr
    [overview] = json.loads(done.stdout)
    assert isinstance(overview["rabbitmq_version"], str)
    assert isinstance(overview["object_totals"]["queues"], int)


def test_rabbitmqadmin_exports_and_imports_definitions():
    exported = scratch(unique("ra-export") + ".json")
    done = rabbitmqadmin("export", exported)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Exported definitions")
    with open(exported) as f:
        document = json.load(f)
    assert has_entry(document["queues"], {"name": "root-preset", "vhost": "/", "durable": True,
                                          "auto_delete": False, "arguments": {}})

    name = unique("ra-imported")
    document["queues"].append({"name": name, "vhost": "/", "durable": True,
                               "auto_delete": False, "arguments": {}})
    imported = scratch(unique("ra-import") + ".json")
    with open(imported, "w") as f:
        json.dump(document, f)
    done = rabbitmqadmin("import", imported)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Uploaded definitions")
    assert amqp_queue_exists(name)
    http("DELETE", queue_path(name))


def test_rabbitmqadmin_reports_refusals_and_errors_with_exit_status_1():
    name = unique("ra-err")
    assert rabbitmqadmin("declare", "queue", f"name={name}", "durable=true").returncode == 0
    done = rabbitmqadmin("declare", "queue", f"name={name}", "durable=false")
    assert done.returncode == 1
    assert "inequivalent arg 'durable'" in done.stderr
    done = rabbitmqadmin("list", "queues", user="plain")
    assert done.returncode == 1 and "Access refused" in done.stderr
    done = rabbitmqadmin("list", "queues", secret="wrong")
    assert done.returncode == 1 and "Access refused" in done.stderr
    assert rabbitmqadmin("delete", "queue", f"name={name}").returncode == 0
    done = rabbitmqadmin("delete", "queue", f"name={name}")
    assert done.returncode == 1 and "Not found" in done.stderr


# --- the ctl --------------------------------------------------------------------------------


def test_ctl_ping_exits_0_while_the_node_serves():
    assert ctl("ping").returncode == 0


def test_ctl_ping_fails_when_nothing_answers():
    done = ctl("ping", prefix=CTL_UNREACHABLE)
    assert done.returncode != 0


def test_ctl_status_exits_0():
    done = ctl("status")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()


def test_ctl_list_queues_prints_a_header_and_tab_separated_rows(amqp, queue):
    _, ch = amqp
    for _ in range(3):
        ch.basic_publish(exchange="", routing_key=queue, body=b"x")
    header, rows = ctl_table_with([queue, "3"], "list_queues", "name", "messages")
    assert header == ["name", "messages"]
    assert any(r[0] == "root-preset" for r in rows)
    # Without columns: name and messages.
    header, rows = ctl_table("list_queues")
    assert header == ["name", "messages"]
    assert [queue, "3"] in rows


def test_ctl_list_queues_columns_in_the_order_asked(amqp, queue):
    _, ch = amqp
    ch.basic_publish(exchange="", routing_key=queue, body=b"x")
    ch.basic_get(queue=queue, auto_ack=False)
    ch.basic_publish(exchange="", routing_key=queue, body=b"y")
    header, rows = ctl_table_with(
        [queue, "1", "1", "0", "false"],
        "list_queues", "name", "messages_ready", "messages_unacknowledged", "consumers", "durable",
    )
    assert header == ["name", "messages_ready", "messages_unacknowledged", "consumers", "durable"]
    assert ["root-preset", "0", "0", "0", "true"] in rows


def test_ctl_list_queues_as_json(amqp, queue):
    _, ch = amqp
    ch.basic_publish(exchange="", routing_key=queue, body=b"x")
    entries = eventually(lambda: ctl_json("list_queues", "name", "messages"),
                         lambda es: {"name": queue, "messages": 1} in es,
                         f"{queue} with 1 message in the ctl's JSON")
    assert isinstance(entries, list)
    assert all(set(e) == {"name", "messages"} for e in entries)


def test_ctl_list_queues_of_another_vhost():
    header, rows = ctl_table("list_queues", "-p", ORDERS, "name")
    assert header == ["name"]
    names = [r[0] for r in rows]
    assert "orders-preset" in names and "root-preset" not in names


def test_ctl_purge_queue(amqp, queue):
    _, ch = amqp
    for _ in range(2):
        ch.basic_publish(exchange="", routing_key=queue, body=b"x")
    ctl_ok("purge_queue", queue)
    assert ready_count(ch, queue) == 0
    assert ctl("purge_queue", unique("no-such-queue")).returncode != 0
    # In another vhost.
    conn = connect("admin", ORDERS)
    ch = conn.channel()
    ch.confirm_delivery()
    name = unique("orders-purge")
    ch.queue_declare(queue=name)
    ch.basic_publish(exchange="", routing_key=name, body=b"x")
    ctl_ok("purge_queue", "-p", ORDERS, name)
    assert ready_count(ch, name) == 0
    ch.queue_delete(queue=name)
    conn.close()


def test_ctl_delete_queue(amqp, queue):
    _, ch = amqp
    ch.basic_publish(exchange="", routing_key=queue, body=b"x")
    # --if-empty refuses a queue holding a message.
    assert ctl("delete_queue", queue, "--if-empty").returncode != 0
    assert amqp_queue_exists(queue)
    ctl_ok("delete_queue", queue)
    assert not amqp_queue_exists(queue)
    assert ctl("delete_queue", queue).returncode != 0


def test_ctl_add_user_change_password_and_delete_user():
    name, first, second = unique("ctl-user"), uuid.uuid4().hex, uuid.uuid4().hex
    ctl_ok("add_user", name, first)
    assert ctl("add_user", name, first).returncode != 0
    ctl_ok("set_permissions", "-p", "/", name, ".*", ".*", ".*")
    connect_as(name, first).close()
    ctl_ok("change_password", name, second)
    connect_as(name, second).close()
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        connect_as(name, first)
    ctl_ok("delete_user", name)
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        connect_as(name, second)
    assert ctl("delete_user", name).returncode != 0
    assert ctl("change_password", name, first).returncode != 0


def test_ctl_set_permissions_and_list_permissions():
    name, secret = unique("ctl-perm"), uuid.uuid4().hex
    ctl_ok("add_user", name, secret)
    ctl_ok("set_permissions", "-p", ORDERS, name, f"^{name}-", "", ".*")
    header, rows = ctl_table("list_permissions", "-p", ORDERS)
    assert header == ["user", "configure", "write", "read"]
    # An empty pattern is an empty field.
    assert [name, f"^{name}-", "", ".*"] in rows
    assert ["manager", ".*", ".*", ".*"] in rows
    entries = ctl_json("list_permissions", "-p", ORDERS)
    assert {"user": name, "configure": f"^{name}-", "write": "", "read": ".*"} in entries
    conn = connect_as(name, secret, ORDERS)
    conn.channel().queue_declare(queue=f"{name}-ok")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        conn.channel().queue_declare(queue=unique("refused"))
    assert closed.value.reply_code == 403
    conn.channel().queue_delete(queue=f"{name}-ok")
    conn.close()
    assert ctl("set_permissions", "-p", "no-such-vhost", name, ".*", ".*", ".*").returncode != 0
    assert ctl("set_permissions", "-p", ORDERS, unique("nobody"), ".*", ".*", ".*").returncode != 0
    ctl_ok("delete_user", name)


def test_ctl_list_permissions_of_the_default_vhost():
    header, rows = ctl_table("list_permissions")
    assert header == ["user", "configure", "write", "read"]
    assert ["watcher", "", "", ".*"] in rows
    assert ["admin", ".*", ".*", ".*"] in rows
    assert not any(r[0] == "manager" for r in rows)


def test_ctl_list_users():
    header, rows = ctl_table("list_users")
    assert header == ["user", "tags"]
    assert ["admin", "[administrator]"] in rows
    assert ["watcher", "[monitoring]"] in rows
    assert ["plain", "[]"] in rows
    entries = ctl_json("list_users")
    assert {"user": "manager", "tags": ["management"]} in entries


def test_ctl_add_vhost_list_vhosts_and_delete_vhost():
    name = unique("ctl-vh")
    ctl_ok("add_vhost", name)
    header, rows = ctl_table("list_vhosts")
    assert header == ["name"]
    assert [name] in rows and ["/"] in rows and [ORDERS] in rows
    assert {"name": name} in ctl_json("list_vhosts")
    # A vhost made by the ctl has no permissions: admin needs one to open it.
    ctl_ok("set_permissions", "-p", name, "admin", ".*", ".*", ".*")
    connect("admin", name).close()
    ctl_ok("delete_vhost", name)
    assert [name] not in ctl_table("list_vhosts")[1]
    assert ctl("delete_vhost", name).returncode != 0


def test_ctl_list_exchanges(amqp):
    _, ch = amqp
    name = unique("ctl-ex")
    ch.exchange_declare(exchange=name, exchange_type="fanout")
    header, rows = ctl_table("list_exchanges", "name", "type")
    assert header == ["name", "type"]
    # The default exchange is the row with an empty name.
    assert ["", "direct"] in rows and ["amq.topic", "topic"] in rows and [name, "fanout"] in rows
    assert ctl_table("list_exchanges")[0] == ["name", "type"]
    ch.exchange_delete(exchange=name)


def test_ctl_list_bindings(amqp, queue):
    _, ch = amqp
    exchange = unique("ctl-bind-ex")
    ch.exchange_declare(exchange=exchange, exchange_type="direct")
    ch.queue_bind(queue=queue, exchange=exchange, routing_key="rk")
    header, rows = ctl_table("list_bindings")
    assert header == ["source_name", "source_kind", "destination_name", "destination_kind",
                      "routing_key", "arguments"]
    assert [exchange, "exchange", queue, "queue", "rk", "[]"] in rows
    # The default exchange's binding of every queue, with an empty source name.
    assert ["", "exchange", queue, "queue", queue, "[]"] in rows
    ch.exchange_delete(exchange=exchange)


def test_ctl_list_connections(fresh_user):
    user, secret = fresh_user
    conn = connect_as(user, secret)
    try:
        conn.channel()
        rows = eventually(
            lambda: ctl_table("list_connections", "user", "vhost"),
            lambda table: [user, "/"] in table[1],
            "the connection in list_connections",
        )
        assert rows[0] == ["user", "vhost"]
        header, rows = ctl_table("list_connections")
        assert header == ["user", "peer_host", "peer_port", "state"]
        [row] = [r for r in rows if r[0] == user]
        assert row[1] == "127.0.0.1" and row[2].isdigit() and row[3] == "running"
        entries = ctl_json("list_connections", "user", "vhost", "channels")
        assert {"user": user, "vhost": "/", "channels": 1} in entries
    finally:
        conn.close()


def test_ctl_list_consumers(fresh_user):
    user, secret = fresh_user
    conn = connect_as(user, secret)
    try:
        ch = conn.channel()
        name = unique("ctl-consumed")
        ch.queue_declare(queue=name, exclusive=True)
        ch.basic_qos(prefetch_count=5)
        ch.basic_consume(queue=name, on_message_callback=lambda *a: None, consumer_tag="ctl-tag")
        header, rows = ctl_table_with(
            [name, "ctl-tag", "true"],
            "list_consumers", "queue_name", "consumer_tag", "ack_required",
        )
        assert header == ["queue_name", "consumer_tag", "ack_required"]
        header, rows = ctl_table("list_consumers")
        # rabbitmqctl 3.10's default columns.
        assert header == ["queue_name", "channel_pid", "consumer_tag", "ack_required",
                          "prefetch_count", "active", "arguments"]
        [row] = [r for r in rows if r[0] == name]
        assert (row[2], row[3], row[4], row[5], row[6]) == ("ctl-tag", "true", "5", "true", "[]")
        [entry] = [e for e in ctl_json("list_consumers") if e["queue_name"] == name]
        assert (entry["consumer_tag"], entry["ack_required"], entry["prefetch_count"],
                entry["active"]) == ("ctl-tag", True, 5, True)
    finally:
        conn.close()


def test_ctl_close_connection(fresh_user):
    user, secret = fresh_user
    conn = connect_as(user, secret)
    conn.channel()
    # rabbitmqctl names a connection by the `pid` column of list_connections.
    header, rows = eventually(
        lambda: ctl_table("list_connections", "pid", "user"),
        lambda table: any(r[1] == user for r in table[1]),
        "the connection in list_connections",
    )
    assert header == ["pid", "user"]
    [pid] = [r[0] for r in rows if r[1] == user]
    ctl_ok("close_connection", pid, "closed by the operator")
    closed = wait_closed_by_broker(conn)
    assert closed.reply_code == 320
    assert closed.reply_text == "CONNECTION_FORCED - closed by the operator"


def test_ctl_export_and_import_definitions():
    exported = scratch(unique("ctl-export") + ".json")
    ctl_ok("export_definitions", exported)
    with open(exported) as f:
        document = json.load(f)
    for key in ("users", "vhosts", "permissions", "queues", "exchanges", "bindings"):
        assert isinstance(document[key], list), key
    assert has_entry(document["queues"], {"name": "orders-preset", "vhost": ORDERS,
                                          "durable": True, "auto_delete": False, "arguments": {}})
    assert "admin" in {u["name"] for u in document["users"]}

    name, user, secret = unique("ctl-imported"), unique("ctl-imported-u"), uuid.uuid4().hex
    document["queues"].append({"name": name, "vhost": ORDERS, "durable": True,
                               "auto_delete": False, "arguments": {}})
    document["users"].append({"name": user, "password_hash": rabbit_password_hash(secret),
                              "hashing_algorithm": "rabbit_password_hashing_sha256",
                              "tags": [], "limits": {}})
    document["permissions"].append({"user": user, "vhost": ORDERS, "configure": ".*",
                                    "write": ".*", "read": ".*"})
    imported = scratch(unique("ctl-import") + ".json")
    with open(imported, "w") as f:
        json.dump(document, f)
    ctl_ok("import_definitions", imported)
    # rabbitmqctl's import may finish after the command returns.
    eventually(lambda: amqp_queue_exists(name, ORDERS), bool, f"{name} imported")
    connect_as(user, secret, ORDERS).close()
    http("DELETE", queue_path(name, ORDERS))
    http("DELETE", f"/api/users/{q(user)}")


# --- the web console, in headless Chromium ---------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def ready_over_amqp(queue):
    """The queue's ready count as AMQP's passive declare tells it, at once (the API's figures
    may lag)."""
    conn = pika.BlockingConnection(
        pika.ConnectionParameters(HOST, PORT, credentials=pika.PlainCredentials(
            "admin", password("admin"))))
    try:
        return conn.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        conn.close()


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium to drive the console with")
def test_the_console_shows_a_declared_queue_and_purges_it_only_once_confirmed(tmp_path):
    from consoles import CONSOLES  # puts ../console, where cdp is, on the path
    from cdp import start_chromium, until

    queue = unique("console")
    assert http("PUT", f"/api/queues/%2F/{queue}", body={"durable": False}).status in (201, 204)
    for i in range(7):
        reply = http("POST", "/api/exchanges/%2F/amq.default/publish", body={
            "routing_key": queue, "payload": f"job {i}", "payload_encoding": "string",
            "properties": {}})
        assert reply.json() == {"routed": True}, reply
    browser, page = start_chromium(CHROMIUM, str(tmp_path / "profile"))
    try:
        page.call("Page.enable")
        console = CONSOLES[BROKER](page, URL)
        console.open()
        console.log_in("admin", "not the password")
        until("the login's refusal", console.refused)
        assert not console.logged_in()
        console.log_in("admin", password("admin"))
        until("the console after logging in", console.logged_in)
        cells = until("the queue in the list, with its 7 ready messages",
                      lambda: (lambda c: c if c and "7" in c else None)(console.listed(queue)))
        assert queue in cells, cells
        console.open_queue(queue)
        until("the queue's page with its 7 ready", lambda: console.queue_ready() == "7")
        # Not confirmed: nothing goes.
        console.purge(confirm=False)
        time.sleep(1)
        assert ready_over_amqp(queue) == 7
        console.purge(confirm=True)
        until("the purge", lambda: ready_over_amqp(queue) == 0)
        until("the queue's page to show it", lambda: console.queue_ready() == "0")
    finally:
        browser.kill()
        browser.wait()
        http("DELETE", f"/api/queues/%2F/{queue}")
