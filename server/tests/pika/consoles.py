"""The web consoles the acceptance suite drives in headless Chromium (contract §11: a console
at `/` that shows the queues, and purges one after a confirmation): RabbitMQ's management UI
and leasemqd's, each behind the same few steps, so that one scenario
(test_management.py's `test_the_console_*`) runs against either.

Each console is driven as a person would: typing into its login form, opening a queue's
page, pressing its purge button and answering its confirmation. RabbitMQ's asks with the
browser's own `confirm()` dialog, answered through the DevTools protocol; leasemqd's with a
dialog in the page. RabbitMQ's UI checks a login with a request the server answers 401 with
`WWW-Authenticate`, so a wrong password brings up the browser's own login prompt, which is
cancelled as a person would, through the protocol's Fetch domain.
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "console"))
from cdp import until  # noqa: E402


def fill(page, selector, value):
    page.js(f"document.querySelector({json.dumps(selector)}).value = {json.dumps(value)}")


def row_cells(page, selector):
    """The texts of the cells of the table row holding what `selector` finds, or None."""
    return page.js(
        f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
        " return e ? [...e.closest('tr').querySelectorAll('td')]"
        ".map(td => td.textContent.trim()) : null; })()")


class RabbitConsole:
    """RabbitMQ 3.10's management UI: a form with `username` and `password`, the queue list
    at `#/queues`, a queue's page at `#/queues/VHOST/NAME` with its figures in the legend of
    its "Queued messages" chart, and a "Purge Messages" button that asks `confirm()`."""

    def __init__(self, page, base):
        self.page, self.base = page, base
        self.answer = False
        self.dialogs = 0

    def open(self):
        page = self.page
        page.handlers["Page.javascriptDialogOpening"] = self.on_dialog
        page.handlers["Fetch.requestPaused"] = lambda event: page.call(
            "Fetch.continueRequest", requestId=event["requestId"])
        page.handlers["Fetch.authRequired"] = lambda event: page.call(
            "Fetch.continueWithAuth", requestId=event["requestId"],
            authChallengeResponse={"response": "CancelAuth"})
        page.call("Fetch.enable", handleAuthRequests=True,
                  patterns=[{"urlPattern": "*/api/whoami*"}])
        page.call("Page.navigate", url=self.base + "/")
        until("the login form", lambda: page.visible("input[name=username]"))

    def on_dialog(self, event):
        self.dialogs += 1
        self.page.call("Page.handleJavaScriptDialog", accept=self.answer)

    def log_in(self, user, secret):
        fill(self.page, "input[name=username]", user)
        fill(self.page, "input[name=password]", secret)
        # The login's request waits on the browser's prompt where the password is wrong:
        # pressed from a timer, so that this call returns and the prompt can be cancelled.
        self.page.js("setTimeout(() => document.querySelector("
                     "'#login input[type=submit]').click(), 0)")

    def refused(self):
        return "Login failed" in (self.page.text("#login-status") or "")

    def logged_in(self):
        return self.page.visible("#logout") and not self.page.visible("#login")

    def legend(self, name):
        """The figure beside `name` in the legends of the page's charts."""
        return self.page.js(
            "(() => { for (const th of document.querySelectorAll('table.legend th')) {"
            f" if (th.textContent.trim() === {json.dumps(name)})"
            " return th.nextElementSibling.textContent.trim(); } return null; })()")

    def listed(self, queue):
        """The cells of `queue`'s row in the queue list, once it is shown there: the list
        filtered by its name, as its filter box does on Enter (the list is paged)."""
        if self.page.js("location.hash") != "#/queues":
            self.page.js("location.hash = '#/queues'")
        self.page.js(
            "(() => { const box = document.querySelector('#queues-name');"
            f" if (box && box.value !== {json.dumps(queue)})"
            f" $(box).val({json.dumps(queue)}).trigger($.Event('keypress', {{keyCode: 13}})); }})()")
        return row_cells(self.page, f"a[href='#/queues/%2F/{queue}']")

    def open_queue(self, queue):
        self.page.js(f"location.hash = '#/queues/%2F/{queue}'")
        # Its "Purge" section starts folded: its heading opens it.
        heading = ("[...document.querySelectorAll('#main div.section-hidden h2')]"
                   ".find(h => h.textContent.trim() === 'Purge')")
        until("the queue's page", lambda: self.page.js(
            f"(() => {{ const h = {heading}; if (h) h.click(); return true; }})()")
              and self.page.visible("input[value='Purge Messages']"))

    def queue_ready(self):
        return self.legend("Ready")

    def purge(self, confirm):
        self.answer = confirm
        asked = self.dialogs
        # The click waits on the dialog it opens: pressed from a timer, so that this call
        # returns and the dialog is answered as it opens.
        self.page.js("setTimeout(() => document.querySelector("
                     "\"input[value='Purge Messages']\").click(), 0)")
        # Each evaluation lets the page's events through, the dialog's among them.
        until("the confirmation", lambda: self.page.js("true") and self.dialogs > asked)


class LeasemqConsole:
    """leasemqd's console: a login form, an overview with `#total-ready`, the queue list at
    `#queues`, a queue's page with `#queue-ready`, and a purge that asks in a dialog of the
    page (`#confirm`)."""

    def __init__(self, page, base):
        self.page, self.base = page, base

    def open(self):
        self.page.call("Page.navigate", url=self.base + "/")
        until("the login form", lambda: self.page.visible("#login-user"))
        # Its script, which the form needs, loads after the form shows.
        until("the page's script", lambda: self.page.js("document.body.dataset.ready === 'true'"))

    def log_in(self, user, secret):
        fill(self.page, "#login-user", user)
        fill(self.page, "#login-password", secret)
        self.page.click("#login-submit")

    def refused(self):
        return "refused" in (self.page.text("#login-error") or "")

    def logged_in(self):
        return self.page.visible("#total-ready") and not self.page.visible("#login-user")

    def listed(self, queue):
        self.page.js("location.hash = '#queues'")
        return row_cells(self.page, f"#queue-rows tr[data-queue='{queue}']")

    def open_queue(self, queue):
        self.page.click(f"#queue-rows tr[data-queue='{queue}']")
        until("the queue's page", lambda: self.page.visible("#queue-purge"))

    def queue_ready(self):
        return self.page.text("#queue-ready")

    def purge(self, confirm):
        self.page.click("#queue-purge")
        until("the confirmation", lambda: self.page.js("document.querySelector('#confirm').open"))
        self.page.click("#confirm-yes" if confirm else "#confirm-no")


CONSOLES = {"rabbitmq": RabbitConsole, "leasemqd": LeasemqConsole}
