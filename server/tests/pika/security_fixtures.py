"""Writes the files a broker under test_security.py starts from.

    python security_fixtures.py DIR

DIR gets:

- ca.pem: a self-signed CA certificate (its key, ca.key, stays beside it);
- server.pem and server.key: an EC P-256 server certificate signed by that CA, for
  DNS:localhost and IP:127.0.0.1, extendedKeyUsage serverAuth, not a CA;
- definitions.json: a RabbitMQ definitions file, in the format `rabbitmqctl
  export_definitions` writes, with the vhosts `/` and `sec-vhost`, the users `admin`,
  `limited` and `rootonly` and their permissions (and three users in the file's other forms:
  a SHA-512 hash, no hashing_algorithm, an empty hash), one durable queue, one topic
  exchange and a binding between them in `sec-vhost`, and a policy and an empty
  `topic_permissions` list (keys a broker that does not use them is expected to skip);
- passwords.json: each user's plain password, for the tests to log in with (for
  `nopassword`, one its empty hash does not accept).

The passwords and the salts of their hashes are random on each run; the names, permissions
and topology are fixed, and test_security.py relies on them.

Certificates are made with the `openssl` command-line tool; nothing else outside Python's
standard library is needed.
"""

import base64
import hashlib
import json
import os
import secrets
import subprocess
import sys

# The vhost the permission tests run in, beside the default vhost `/`.
SEC_VHOST = "sec-vhost"

# Each user's tags, permissions, as (vhost, configure, write, read), and how its password is
# hashed ("hashing"): "sha256" unless it says otherwise.
USERS = {
    "admin": {
        "tags": ["administrator"],
        "permissions": [("/", ".*", ".*", ".*"), (SEC_VHOST, ".*", ".*", ".*")],
    },
    # May create, use and delete only `limited-…` resources of sec-vhost, and publish through
    # the default exchange (named `amq.default` in permission checks).
    "limited": {
        "tags": [],
        "permissions": [
            (SEC_VHOST, "^limited-", r"^(limited-|amq\.default$)", "^limited-"),
        ],
    },
    # Everything on `/`, nothing on sec-vhost.
    "rootonly": {
        "tags": [],
        "permissions": [("/", ".*", ".*", ".*")],
    },
    # May use only server-named queues (amq.gen-…) of sec-vhost.
    "servernamed": {
        "tags": [],
        "permissions": [(SEC_VHOST, r"^amq\.gen-", r"^amq\.default$", r"^amq\.gen-")],
    },
    # The other forms a user entry takes in RabbitMQ's files: a SHA-512 hash, with the tags
    # as one comma-separated string (older exports)...
    "sha512user": {
        "tags": "management,policymaker",
        "permissions": [("/", ".*", ".*", ".*")],
        "hashing": "sha512",
    },
    # ...no `hashing_algorithm` at all (SHA-256 is meant)...
    "defaulthash": {
        "tags": [],
        "permissions": [("/", ".*", ".*", ".*")],
        "hashing": "missing",
    },
    # ...and an empty hash: a user that cannot log in with any password.
    "nopassword": {
        "tags": [],
        "permissions": [("/", ".*", ".*", ".*")],
        "hashing": "empty",
    },
}

CA_EXTENSIONS = """\
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
"""

SERVER_EXTENSIONS = """\
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyAgreement
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
"""

# A minimal openssl configuration, so that `openssl req` reads neither the system's file nor
# its default extensions.
REQ_CONFIG = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
"""


def rabbit_password_hash(password, algorithm="sha256"):
    """RabbitMQ's rabbit_password_hashing_sha256 (or _sha512): base64 of a 4-byte random salt
    followed by SHA-256(salt || password) (or SHA-512)."""
    salt = secrets.token_bytes(4)
    digest = hashlib.new(algorithm, salt + password.encode()).digest()
    return base64.b64encode(salt + digest).decode()


def user_entry(name, spec, password):
    """One `users` entry of the definitions."""
    hashing = spec.get("hashing", "sha256")
    entry = {"name": name}
    if hashing == "empty":
        entry["password_hash"] = ""
        entry["hashing_algorithm"] = "rabbit_password_hashing_sha256"
    elif hashing == "missing":
        entry["password_hash"] = rabbit_password_hash(password)
    else:
        entry["password_hash"] = rabbit_password_hash(password, hashing)
        entry["hashing_algorithm"] = f"rabbit_password_hashing_{hashing}"
    entry["tags"] = spec["tags"]
    entry["limits"] = {}
    return entry


def openssl(*args, cwd):
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"openssl {' '.join(args)} failed:\n{done.stderr}")


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def make_certificates(out):
    """ca.pem/ca.key, then server.key and server.pem signed by the CA."""
    # `openssl req` takes extension sections from its -config file only.
    write(os.path.join(out, "req.cnf"), REQ_CONFIG + CA_EXTENSIONS)
    write(os.path.join(out, "server.ext"), SERVER_EXTENSIONS)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    openssl(
        "req", "-config", "req.cnf", "-x509", *ec,
        "-keyout", "ca.key", "-out", "ca.pem", "-days", "3650",
        "-subj", "/CN=leasemq security test CA", "-extensions", "ca",
        cwd=out,
    )
    openssl(
        "req", "-config", "req.cnf", "-new", *ec,
        "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost",
        cwd=out,
    )
    openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-set_serial", str(secrets.randbits(63)), "-days", "825", "-sha256",
        "-extfile", "server.ext", "-extensions", "server", "-out", "server.pem",
        cwd=out,
    )
    for scratch in ("req.cnf", "server.ext", "server.csr"):
        os.remove(os.path.join(out, scratch))


def definitions(passwords):
    """The definitions document, as `rabbitmqctl export_definitions` lays it out."""
    users = [user_entry(name, spec, passwords[name]) for name, spec in USERS.items()]
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
        "vhosts": [{"name": "/"}, {"name": SEC_VHOST}],
        "permissions": permissions,
        "topic_permissions": [],
        "parameters": [],
        "global_parameters": [],
        # A policy that matches no queue the tests use: a broker that applies policies
        # changes nothing the tests see, and one that does not skips the entry.
        "policies": [
            {
                "vhost": SEC_VHOST,
                "name": "unused-length-limit",
                "pattern": "^no-queue-has-this-name$",
                "apply-to": "queues",
                "definition": {"max-length": 1000},
                "priority": 0,
            }
        ],
        "queues": [
            {
                "name": "limited-preset",
                "vhost": SEC_VHOST,
                "durable": True,
                "auto_delete": False,
                "arguments": {},
            }
        ],
        "exchanges": [
            {
                "name": "limited-events",
                "vhost": SEC_VHOST,
                "type": "topic",
                "durable": True,
                "auto_delete": False,
                "internal": False,
                "arguments": {},
            }
        ],
        "bindings": [
            {
                "source": "limited-events",
                "vhost": SEC_VHOST,
                "destination": "limited-preset",
                "destination_type": "queue",
                "routing_key": "preset.#",
                "arguments": {},
            }
        ],
    }


def main():
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    make_certificates(out)
    passwords = {name: secrets.token_urlsafe(12) for name in USERS}
    write(os.path.join(out, "definitions.json"), json.dumps(definitions(passwords), indent=2))
    write(os.path.join(out, "passwords.json"), json.dumps(passwords, indent=2))


if __name__ == "__main__":
    main()
