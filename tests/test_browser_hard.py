"""The worst of the hard input in a real browser, two sessions side by side, and the server's defaults.

The ``page`` fixture fails a test when any dialog opens: markup that ran would show as an alert.
"""
import json
import socket
import tomllib
import urllib.parse
from pathlib import Path

import pytest

from analysis.attention.views import token_label
from app_pages.results.messages import short
from harness.browser import ROOT, commit_text, every_kth, plot_title, settled, shot, wait_title, x_ticks
from tests.test_hard_inputs import HARD
from viz.figures import visible

MARKUP = HARD["markup"]
BROWSER_HARD = {k: HARD[k] for k in ("emoji sequences and flags", "CJK", "right-to-left", "control characters",
                                     "bidi override", "zero-width and soft hyphen", "markup")}


def wait_for_title(page, text: str) -> None:
    # a long title is drawn as lines, whose text runs together where a space was
    page.wait_for_function("t => { const e = document.querySelector('.js-plotly-plot .gtitle');"
                           " return e && e.textContent.replace(/\\s/g, '') === t.replace(/\\s/g, ''); }",
                           arg=text, timeout=60_000)


def test_hard_text_typed_into_the_browser(page, hf_model):
    for name, text in BROWSER_HARD.items():
        commit_text(page, text)
        wait_for_title(page, visible(f"Layer 0 · {short(text, 70)}"))
        tokens = [token_label(t) for t in hf_model.attend(text).tokens]
        cut = [t if len(t) <= 12 else t[:11] + "…" for t in tokens]
        assert every_kth(x_ticks(page), [visible(t) for t in cut]), name
        assert not page.locator("[data-testid='stException']").count()
    shot(page, "hard-text")
    settled(page, 1)
    assert not page.dialogs


def test_ten_thousand_characters_are_cut_with_a_note(page, hf_model):
    text = "word " * 1999 + "end."
    commit_text(page, text)
    page.get_by_text("the model reads at most 512, so it was cut there").wait_for(timeout=60_000)
    n = hf_model.attend(text).n_tokens_original
    assert f"This text has {n} tokens" in page.locator("[data-testid='stAlert']").first.inner_text()
    commit_text(page, "Short again.")
    wait_title(page, "Layer 0 · Short again.")
    assert not page.locator("[data-testid='stAlert']").count()


def test_exported_html_shows_markup_as_text(page, browser, tmp_path):
    commit_text(page, MARKUP)
    wait_for_title(page, visible(f"Layer 0 · {short(MARKUP, 70)}"))
    # the figure is written on the click: slow while the shared server prepares a bundled decoder that an earlier
    # browser test opened (the preparation steps aside for shared results, not for an export); the click waits for
    # the run's last button, whose file a rerun would replace
    settled(page, 1, timeout=300_000)
    with page.expect_download(timeout=300_000) as info:
        page.get_by_role("button", name="Figure · HTML").click()
    exported = browser.new_page()
    dialogs = []
    exported.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    info.value.save_as(tmp_path / "figure.html")
    exported.goto((tmp_path / "figure.html").as_uri())
    exported.wait_for_selector(".js-plotly-plot .gtitle", timeout=30_000)
    assert plot_title(exported) == f"Layer 0 · {short(MARKUP, 70)}"
    assert exported.locator("img[src='x']").count() == 0
    settled(exported, 1)
    assert not dialogs
    exported.close()


def test_markdown_in_a_model_name_is_shown_as_typed(page, server):
    name = "![x](http://127.0.0.1:9/x.png) **bold** :red[red] <img src=x onerror=alert(3)> me@example.com"
    page.goto(f"{server}/?model=custom&custom_model={urllib.parse.quote(name)}")
    alert = page.locator("[data-testid='stAlert']").first
    alert.wait_for(timeout=60_000)
    assert f"No model '{name}' was found" in alert.inner_text().replace("\u2060", "")
    inner = alert.inner_html()
    assert "<img" not in inner and "<strong" not in inner and "<a " not in inner and 'color' not in inner
    shot(page, "markdown-model-name")


def test_two_sessions_keep_their_own_state(browser, server):
    """Two browser contexts are two people: what one chooses never reaches the other."""
    a, b = (browser.new_context(viewport={"width": 1400, "height": 1000}).new_page() for _ in range(2))
    a.goto(f"{server}/?model=scratch&heads_off=0.1&causal=true&layer=2")
    b.goto(f"{server}/")
    commit_text(a, "Session A reads about kites.")
    wait_title(a, "Layer 2 · Session A reads about kites.")
    wait_title(b, "Layer 0 · Which do you like better")
    commit_text(b, "Session B reads about boats.")
    wait_title(b, "Layer 0 · Session B reads about boats.")
    a.get_by_role("link", name="Tokens", exact=True).click()
    wait_title(a, "Layer 2 · Session A reads about kites.")
    # the link is written as the sidebar's widgets are drawn, which may come after the chart's title
    a.wait_for_function("() => ['heads_off=0.1', 'causal=true', 'model=scratch']"
                        ".every(p => location.search.includes(p))", timeout=60_000)
    assert "heads_off" not in b.url and "model=" not in b.url
    b.reload()  # a new session, rebuilt from b's own link
    wait_title(b, "Layer 0 · Session B reads about boats.")
    for p in (a, b):
        assert not p.locator("[data-testid='stException']").count()
        p.context.close()


# --- server defaults -------------------------------------------------------------------------------

def config() -> dict:
    return tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())


def test_server_defaults_in_the_config():
    c = config()
    assert c["server"]["address"] == "localhost"
    assert c["server"]["enableXsrfProtection"] is True and c["server"]["enableCORS"] is True
    assert c["server"]["maxUploadSize"] == 1
    assert c["browser"]["gatherUsageStats"] is False
    assert c["client"]["showErrorDetails"] == "none"


def test_a_script_run_leaves_its_garbage_to_the_collector_and_the_janitor(monkeypatch):
    """Streamlit, reading the repository's config as a server started there does, skips its full collection after
    every script run: on a server holding a model's prepared results it held the interpreter lock for a third of
    the server's busy time in a class. A misspelt option would be ignored and leave Streamlit's default on."""
    from streamlit import config as streamlit_config

    monkeypatch.chdir(ROOT)
    streamlit_config.get_config_options(force_reparse=True)
    assert streamlit_config.get_option("runner.postScriptGC") is False


def _listening(port: int) -> list[str]:
    """Local addresses of the sockets listening on ``port``, from the kernel's tables."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.append(address)
    return found


def test_the_server_listens_on_loopback_only(server):
    port = urllib.parse.urlparse(server).port
    addresses = _listening(port)
    loopback = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1 and ::1 as the kernel writes them
    assert addresses and set(addresses) <= loopback, addresses


def _websocket_status(server: str, host: str) -> int:
    port = urllib.parse.urlparse(server).port
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall((f"GET /_stcore/stream HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                   f"Origin: http://{host}\r\n\r\n").encode())
        return int(s.recv(1024).split(b" ")[1])


@pytest.mark.parametrize("host,allowed", [("localhost", True), ("127.0.0.1", True),
                                          ("attacker.example", False)])
def test_websocket_only_for_the_allowed_host_names(server, host, allowed):
    """A page on another name that resolves here (DNS rebinding) cannot open a session."""
    port = urllib.parse.urlparse(server).port
    status = _websocket_status(server, f"{host}:{port}")
    assert (status == 101) == allowed, status


def test_uploads_over_the_limit_are_refused_by_the_server(page, server):
    page.goto(server + "/roles?corpus=upload")
    page.get_by_text("Upload a text file").wait_for(timeout=60_000)
    page.locator("input[type=file]").set_input_files(
        files=[{"name": "big.txt", "mimeType": "text/plain", "buffer": b"A sentence.\n" * 100_000}])
    page.get_by_text("File must be 1.0MB or smaller").or_(page.get_by_text("exceeds")).first.wait_for(timeout=30_000)
    assert not page.locator("[data-testid='stException']").count()
    json.dumps(config())  # the limit above is the config's
