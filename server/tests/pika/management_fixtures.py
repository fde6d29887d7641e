"""Writes the files a broker under test_management.py starts from.

    python management_fixtures.py DIR

DIR gets:

- definitions.json: a RabbitMQ definitions file, in the format `rabbitmqctl
  export_definitions` writes, with the vhosts `/` and `orders`, the users below and their
  permissions, and one durable queue in each vhost (`root-preset` in `/`, `orders-preset`
  in `orders`), so that the per-vhost visibility tests have something to see or not see;
- passwords.json: each user's plain password, for the tests to log in with.

The users, one for each management tag the contract names:

- `admin`: tags `administrator`, every permission on `/` and `orders`;
- `watcher`: tags `monitoring`, on `/` only: configure `""`, write `""`, read `.*`;
- `manager`: tags `management`, every permission on `orders` only;
- `plain`: no tags, every permission on `/`.

The passwords and the salts of their hashes are random on each run; the names, tags,
permissions and queues are fixed, and test_management.py relies on them. Nothing outside
Python's standard library is needed.
"""

import base64
import hashlib
import json
import os
import secrets
import sys

# The vhost beside the default vhost `/`.
ORDERS_VHOST = "orders"

# Each user's tags and permissions, as (vhost, configure, write, read).
USERS = {
    "admin": {
        "tags": ["administrator"],
        "permissions": [("/", ".*", ".*", ".*"), (ORDERS_VHOST, ".*", ".*", ".*")],
    },
    # Reads everything on `/` and may configure and write nothing there (`""` matches no
    # name).
    "watcher": {
        "tags": ["monitoring"],
        "permissions": [("/", "", "", ".*")],
    },
    "manager": {
        "tags": ["management"],
        "permissions": [(ORDERS_VHOST, ".*", ".*", ".*")],
    },
    # A user of AMQP only: no tag, so no access to the management API.
    "plain": {
        "tags": [],
        "permissions": [("/", ".*", ".*", ".*")],
    },
}

# The durable queues the definitions declare, one per vhost.
QUEUES = [("/", "root-preset"), (ORDERS_VHOST, "orders-preset")]


def rabbit_password_hash(password):
    """RabbitMQ's rabbit_password_hashing_sha256: base64 of a 4-byte random salt followed by
    SHA-256(salt || password)."""
    salt = secrets.token_bytes(4)
    digest = hashlib.sha256(salt + password.encode()).digest()
    return base64.b64encode(salt + digest).decode()


def definitions(passwords):
    """The definitions document, as `rabbitmqctl export_definitions` lays it out."""
    users = [
        {
            "name": name,
            "password_hash": rabbit_password_hash(passwords[name]),
            "hashing_algorithm": "rabbit_password_hashing_sha256",
            "tags": spec["tags"],
            "limits": {},
        }
        for name, spec in USERS.items()
    ]
    permissions = [
        {"user": name, "vhost": vhost, "configure": configure, "write": write, "read": read}
        for name, spec in USERS.items()
        for vhost, configure, write, read in spec["permissions"]
    ]
    return {
        "rabbit_version": "3.10.8",
        "rabbitmq_version": "3.10.8",
        "product_name": "RabbitMQ",
        "product_version": "3.10.8",
        "users": users,
        "vhosts": [{"name": "/"}, {"name": ORDERS_VHOST}],
        "permissions": permissions,
        "topic_permissions": [],
        "parameters": [],
        "global_parameters": [],
        "policies": [],
        "queues": [
            {
                "name": name,
                "vhost": vhost,
                "durable": True,
                "auto_delete": False,
                "arguments": {},
            }
            for vhost, name in QUEUES
        ],
        "exchanges": [],
        "bindings": [],
    }


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def main():
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    passwords = {name: secrets.token_urlsafe(12) for name in USERS}
    write(os.path.join(out, "definitions.json"), json.dumps(definitions(passwords), indent=2))
    write(os.path.join(out, "passwords.json"), json.dumps(passwords, indent=2))


if __name__ == "__main__":
    main()
