"""A headless Chromium driven over the DevTools protocol: what the console tests share
(console_test.py, and the acceptance suite's console test in ../pika/test_management.py).
"""

import json
import os
import subprocess
import time
import urllib.request

import websocket  # websocket-client

WAIT_S = 30


class Failed(Exception):
    """A check of a console test that did not hold: what was expected, and what was seen."""


def until(what, probe, wait_s=WAIT_S):
    """Polls `probe` until it returns something true; raises `Failed` naming `what` after
    `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise Failed(f"timed out waiting for {what}")
        time.sleep(0.1)


class Page:
    """One browser tab, over the DevTools protocol."""

    def __init__(self, ws_url):
        self.ws = websocket.create_connection(ws_url, timeout=WAIT_S)
        self.next_id = 0
        # Answers that came while another was awaited (a handler's call, made while the
        # page waited on it, finishes before the call that was waiting).
        self.answers = {}
        # What to do with an event as it comes, by its name: a dialog to answer, a request
        # to let through. The page may wait on it, so it cannot wait for the next call.
        self.handlers = {}

    def call(self, method, **params):
        self.next_id += 1
        awaited = self.next_id
        self.ws.send(json.dumps({"id": awaited, "method": method, "params": params}))
        while awaited not in self.answers:
            self.take(json.loads(self.ws.recv()))
        message = self.answers.pop(awaited)
        if "error" in message:
            raise Failed(f"{method}: {message['error']}")
        return message.get("result", {})

    def take(self, message):
        """One message from the browser: an answer is kept for its call, an event handed
        to its handler."""
        if "id" in message:
            self.answers[message["id"]] = message
        elif message.get("method") in self.handlers:
            self.handlers[message["method"]](message.get("params", {}))

    def js(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, awaitPromise=True,
                           returnByValue=True)
        if "exceptionDetails" in result:
            raise Failed(f"{expression}: {result['exceptionDetails']}")
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


