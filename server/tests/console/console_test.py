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

import websocket  # websocket-client

WAIT_S = 20
USER, PASSWORD = "admin", "console-secret"


def fail(why):
    print(f"console test: {why}", file=sys.stderr)
    sys.exit(1)


def until(what, probe, wait_s=WAIT_S):
    """Polls `probe` until it returns something true; fails naming `what` after `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            fail(f"timed out waiting for {what}")
        time.sleep(0.1)


def start_leasemqd(binary):
    proc = subprocess.Popen(
        [binary, "--listen", "127.0.0.1:0", "--management", "127.0.0.1:0",
         "--user", f"{USER}:{PASSWORD}", "--shards", "2", "--log-level", "warn"],
        stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if " ready: " not in line:
        fail(f"leasemqd did not start: {line!r}")
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


class Page:
    """One browser tab, over the DevTools protocol."""

    def __init__(self, ws_url):
        self.ws = websocket.create_connection(ws_url, timeout=WAIT_S)
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    fail(f"{method}: {message['error']}")
                return message.get("result", {})

    def js(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, awaitPromise=True,
                           returnByValue=True)
        if "exceptionDetails" in result:
            fail(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def click(self, selector):
        self.js(f"document.querySelector({json.dumps(selector)}).click()")

    def text(self, selector):
        return self.js(f"(document.querySelector({json.dumps(selector)}) || {{}}).textContent")

    def visible(self, selector):
        return self.js(f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
                       f" return !!e && !e.closest('[hidden]') && e.offsetParent !== null; }})()")


def start_chromium(binary, profile):
    proc = subprocess.Popen(
        [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--remote-debugging-port=0", f"--user-data-dir={profile}", "--window-size=1280,900",
         "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port_file = os.path.join(profile, "DevToolsActivePort")
    until("Chromium's DevTools port", lambda: os.path.exists(port_file)
          and open(port_file).read().strip())
    port = open(port_file).read().split()[0]
    targets = until("a page target", lambda: [
        t for t in json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
        if t["type"] == "page"])
    return proc, Page(targets[0]["webSocketDebuggerUrl"])


def main():
    if len(sys.argv) != 4:
        fail(__doc__)
    leasemqd, chromium, screenshot = sys.argv[1:]
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
            fail("the login form is still shown after logging in")
        until("the overview's figures", lambda: page.text("#total-ready") == "7")

        page.js("location.hash = '#queues'")
        row = "#queue-rows tr[data-queue='console-demo']"
        until("the declared queue in the list", lambda: page.visible(row))
        cells = page.js(f"[...document.querySelectorAll(\"{row} td\")].map(td => td.textContent)")
        if cells[1] != "console-demo" or cells[3] != "7":
            fail(f"the queue's row says {cells}")
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
            fail(f"a cancelled purge removed messages: {ready} left")

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
