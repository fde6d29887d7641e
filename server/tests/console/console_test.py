"""The web console in a real headless Chromium, driven over the DevTools protocol: it
loads, refuses a wrong password, logs in, shows a queue that was declared with its ready
count, keeps the messages when a purge is not confirmed, purges them once it is, and
saves a screenshot of the queue page.

    python3 console_test.py LEASEMQD_BINARY CHROMIUM_BINARY SCREENSHOT.png

Exits non-zero, saying why, on the first check that fails.
"""

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

from cdp import WAIT_S, Failed, start_chromium, until

USER, PASSWORD = "admin", "console-secret"


def fail(why):
    print(f"console test: {why}", file=sys.stderr)
    sys.exit(1)


def start_leasemqd(binary):
    proc = subprocess.Popen(
        [binary, "--listen", "127.0.0.1:0", "--management", "127.0.0.1:0",
         "--user", f"{USER}:{PASSWORD}", "--shards", "2", "--log-level", "warn"],
        stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if " ready: " not in line:
        raise Failed(f"leasemqd did not start: {line!r}")
    at = line.split("management API on http://")[1].split("/api/")[0]
    return proc, f"http://{at}"


def api(base, method, path, body=None):
    auth = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + path, data=data, method=method, headers={
        "Authorization": f"Basic {auth}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=WAIT_S) as response:
        text = response.read()
        return json.loads(text) if text else None


def main():
    if len(sys.argv) != 4:
        fail(__doc__)
    try:
        run(*sys.argv[1:])
    except Failed as e:
        fail(str(e))


def run(leasemqd, chromium, screenshot):
    profile = tempfile.mkdtemp(prefix="console-chromium-")
    server, base = start_leasemqd(leasemqd)
    browser = None
    try:
        api(base, "PUT", "/api/queues/%2F/console-demo", {"durable": False})
        api(base, "PUT", "/api/queues/%2F/thumbnails", {"durable": False})
        for i in range(7):
            api(base, "POST", "/api/exchanges/%2F/amq.default/publish", {
                "routing_key": "console-demo", "payload": f"job {i}",
                "payload_encoding": "string", "properties": {}})
        browser, page = start_chromium(chromium, profile)
        page.call("Page.enable")
        page.call("Page.navigate", url=base + "/")
        until("the login form", lambda: page.visible("#login-user"))
        # Its script, which the form needs, loads after the form shows.
        until("the page's script", lambda: page.js("document.body.dataset.ready === 'true'"))

        # A wrong password is refused, in the page.
        page.js("document.querySelector('#login-user').value = 'admin';"
                "document.querySelector('#login-password').value = 'wrong'")
        page.click("#login-submit")
        until("the refusal", lambda: "refused" in (page.text("#login-error") or ""))

        page.js(f"document.querySelector('#login-password').value = {json.dumps(PASSWORD)}")
        page.click("#login-submit")
        until("the overview after logging in", lambda: page.visible("#total-ready"))
        if page.visible("#login-user"):
            raise Failed("the login form is still shown after logging in")
        until("the overview's figures", lambda: page.text("#total-ready") == "7")

        page.js("location.hash = '#queues'")
        row = "#queue-rows tr[data-queue='console-demo']"
        until("the declared queue in the list", lambda: page.visible(row))
        cells = page.js(f"[...document.querySelectorAll(\"{row} td\")].map(td => td.textContent)")
        if cells[1] != "console-demo" or cells[3] != "7":
            raise Failed(f"the queue's row says {cells}")
        page.click(row)
        until("the queue's page", lambda: page.visible("#queue-purge")
              and page.text("#queue-ready") == "7")

        # A purge asks first: cancelled, nothing goes.
        page.click("#queue-purge")
        until("the confirmation", lambda: page.js("document.querySelector('#confirm').open"))
        page.click("#confirm-no")
        time.sleep(0.5)
        ready = api(base, "GET", "/api/queues/%2F/console-demo")["messages_ready"]
        if ready != 7:
            raise Failed(f"a cancelled purge removed messages: {ready} left")

        # Confirmed: the ready messages go.
        page.click("#queue-purge")
        until("the confirmation", lambda: page.js("document.querySelector('#confirm').open"))
        page.click("#confirm-yes")
        until("the purge", lambda: api(base, "GET", "/api/queues/%2F/console-demo")
              ["messages_ready"] == 0)
        until("the page to show it", lambda: page.text("#queue-ready") == "0")

        shot = page.call("Page.captureScreenshot", format="png")
        os.makedirs(os.path.dirname(os.path.abspath(screenshot)), exist_ok=True)
        with open(screenshot, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        print(f"console test: passed; screenshot in {screenshot}")
    finally:
        if browser:
            browser.kill()
            browser.wait()
        server.kill()
        server.wait()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    main()
