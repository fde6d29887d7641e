#!/usr/bin/env bash
# The web console in headless Chromium (console_test.py): installs Debian's `chromium`
# where it is missing (as root, with apt-get) and `websocket-client` into the virtual
# environment the pika tests use, builds leasemqd as `cargo test` builds it, and runs the
# test. The screenshot it takes is kept at target/artifacts/console.png.
#
#   server/tests/console/run.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
cd "$root"

chromium=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$chromium" ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "console test: no chromium, and not root to install it" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    chromium=$(command -v chromium)
fi

venv="$root/target/pika-venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -c 'import websocket' 2>/dev/null ||
    "$venv/bin/pip" install --quiet "websocket-client>=1.6,<2"

cargo test --locked --workspace --no-run
export PYTHONDONTWRITEBYTECODE=1
exec "$venv/bin/python" "$here/console_test.py" target/debug/leasemqd "$chromium" \
    target/artifacts/console.png
