"""Fetching a model from the Hub on request: against a Hub endpoint this test serves on 127.0.0.1 (never the
internet), a tiny random Llama is fetched and opens on both engines; a model with only pickled weights, one
that needs its own code and one too large are refused before their weights are fetched; offline stays the
default."""
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from models import HeadLensError, load_model
from models.limits import MAX_WEIGHT_BYTES
from tests.test_llama import build

SHA = "0123456789abcdef0123456789abcdef01234567"


class Hub:
    """A few repositories as the Hub's API and file routes serve them; ``fetched`` lists every file sent."""

    def __init__(self, repos: dict[str, dict[str, bytes]], sizes: dict[tuple[str, str], int] | None = None):
        self.repos, self.sizes, self.fetched = repos, sizes or {}, []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self.answer(body=False)

            def do_GET(self):
                self.answer(body=True)

            def answer(self, body: bool):
                path = self.path.split("?")[0]
                if path.startswith("/api/models/"):
                    repo = path[len("/api/models/"):].split("/revision/")[0]
                    if repo not in hub.repos:
                        return self.send_error(404)
                    files = hub.repos[repo]
                    data = json.dumps({"id": repo, "modelId": repo, "sha": SHA, "siblings": [
                        {"rfilename": f, "size": hub.sizes.get((repo, f), len(b))} for f, b in files.items()]}).encode()
                    return self.reply(data, "application/json", body)
                for repo, files in hub.repos.items():
                    prefix = f"/{repo}/resolve/"
                    if path.startswith(prefix):
                        name = path[len(prefix):].split("/", 1)[1]
                        if name not in files:
                            return self.send_error(404)
                        if body:
                            hub.fetched.append((repo, name))
                        return self.reply(files[name], "application/octet-stream", body,
                                          etag=hashlib.sha256(files[name]).hexdigest())
                self.send_error(404)

            def reply(self, data: bytes, kind: str, body: bool, etag: str | None = None):
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("X-Repo-Commit", SHA)
                self.send_header("ETag", f'"{etag or hashlib.sha256(data).hexdigest()}"')
                self.end_headers()
                if body:
                    self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def hub(tmp_path, monkeypatch):
    _, folder, hf, tok = build("llama", tmp_path / "tiny")
    files = {p.name: p.read_bytes() for p in Path(folder).iterdir() if p.is_file()}
    config = json.loads(files["config.json"])
    repos = {
        "someone/tiny-llama": files,
        "someone/pickled": {**{k: v for k, v in files.items() if not k.endswith(".safetensors")},
                            "pytorch_model.bin": b"not really a pickle"},
        "someone/own-code": {**files, "config.json": json.dumps({**config, "auto_map": {"AutoModel": "m.M"}}).encode(),
                             "modeling_m.py": b"import os"},
        "someone/too-big": files,
    }
    server = Hub(repos, sizes={("someone/too-big", "model.safetensors"): MAX_WEIGHT_BYTES + 1})
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # the suite keeps the library offline; this server is local
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    yield server, hf, tok
    server.server.shutdown()


def test_a_model_is_fetched_on_request_and_opens_on_both_engines(hub):
    server, hf, tok = hub
    with pytest.raises(HeadLensError, match="downloads nothing unless asked"):
        load_model("someone/tiny-llama")                                # offline stays the default
    assert server.fetched == []
    seen = []
    model = load_model("someone/tiny-llama", download=True, progress=lambda done, total: seen.append((done, total)))
    assert seen[-1][0] == seen[-1][1] and [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert {f for _, f in server.fetched} >= {"config.json", "model.safetensors", "tokenizer.json"}
    ours = load_model("someone/tiny-llama", backend="scratch")         # now in the cache: found offline
    text = "The cat sat on the mat."
    import torch

    with torch.inference_mode():
        want = torch.stack(hf(**tok(text, return_tensors="pt"), output_attentions=True).attentions, 1)[0].numpy()
    for m in (model, ours):
        np.testing.assert_allclose(m.attend(text).weights, want, atol=1e-4)
    assert len(server.fetched) == len(set(server.fetched))             # nothing fetched twice


@pytest.mark.parametrize("repo,said", [("someone/pickled", "no safetensors weights"),
                                       ("someone/own-code", "Python code of its own"),
                                       ("someone/too-big", "GiB of weights"),
                                       ("someone/nothing-here", "could not be looked up")])
def test_what_must_not_load_is_refused_before_its_weights_are_fetched(hub, repo, said):
    server, hf, tok = hub
    with pytest.raises(HeadLensError, match=said):
        load_model(repo, download=True)
    assert not [f for r, f in server.fetched if r == repo and f.endswith((".safetensors", ".bin", ".py"))]


def test_the_sidebars_switch_fetches_a_model_and_the_page_opens(hub, new_app):
    server, hf, tok = hub
    at = new_app({"model": "custom", "custom_model": "someone/tiny-llama"})
    assert "downloads nothing unless asked" in at.error[0].value and server.fetched == []
    at.toggle(key="custom_download").set_value(True).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert ("someone/tiny-llama", "model.safetensors") in server.fetched
    assert at.get("plotly_chart")
