"""A vision model whose projector does not fit in memory is loaded for text only, not refused (issue 25 item 5).

The generated vision pair (`gguf_factory.write_tiny_vision_pair`) is served by a real daemon whose memory
budget holds the text model but not the text model and its projector: the model loads with llama.cpp for
real, without the projector; its listing says it takes text only and why; an image is a clear 400; text
is answered. A projector that llama.cpp's multimodal library refuses (made for another model's width)
gives the same, with its own reason.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import httpx
import pytest
from gguf_factory import write_tiny_gguf, write_tiny_mmproj_gguf, write_tiny_vision_pair
from PIL import Image
from support import LiveDaemon, link_models, start_daemon

from lmsp_tray.engine.manager import MemoryBudget

VISION_ID = "tiny-vision:1m-f32"


@pytest.fixture(scope="module")
def squeezed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveDaemon]:
    """A daemon whose model budget is the text model's plan and half its projector's."""
    pair = write_tiny_vision_pair(tmp_path_factory.mktemp("vision"))
    models = link_models(tmp_path_factory.mktemp("models"), list(pair))
    live = start_daemon(models, home=tmp_path_factory.mktemp("home"))
    try:
        manager = live.daemon.models
        entry = live.service.catalog.get(VISION_ID)
        assert entry is not None and entry.vision
        plan = manager.plan(entry)
        assert plan.projector_bytes > 0
        budget = MemoryBudget(max_models=3, ram_bytes=plan.ram_bytes - plan.projector_bytes // 2)
        manager.reconfigure(manager.options_for(VISION_ID), budget)
        yield live
    finally:
        live.stop()


@pytest.fixture
def v1(squeezed: LiveDaemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=squeezed.base + "/v1", timeout=120, headers=squeezed.auth_headers) as c:
        yield c


def image_url() -> str:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 90)).save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def chat(text: str, *, image: bool = False) -> dict:
    content: list[dict] = [{"type": "text", "text": text}]
    if image:
        content.append({"type": "image_url", "image_url": {"url": image_url()}})
    return {"model": VISION_ID, "messages": [{"role": "user", "content": content}], "max_tokens": 4, "temperature": 0}


def check_text_only(live: LiveDaemon, v1: httpx.Client, why: str) -> None:
    """The model loads on a text request, is listed as taking text only because `why`, refuses an image
    with a 400 naming `vision` and `why`, and still answers text."""
    r = v1.post("/chat/completions", json=chat("hello"))
    assert r.status_code == 200, r.text  # not 507, not a failed load
    assert r.json()["choices"][0]["message"]["content"] is not None

    with httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as c:
        model = c.get(f"/models/{VISION_ID}").json()
    own = model["extensions"]["lmsp_tray"]
    assert model["state"] == "loaded"
    assert own["input_modalities"] == ["text"]
    assert why in own["projector_skipped"] and "text only" in own["projector_skipped"]
    assert own["projector"]["file_name"] == "mmproj-tiny-vision.gguf"  # it has one, beside it
    listed = {m["id"]: m for m in v1.get("/models").json()["data"]}
    assert "vision" not in listed[VISION_ID]["capabilities"]
    with httpx.Client(base_url=live.base, timeout=60, headers=live.auth_headers) as ollama:
        assert "vision" not in ollama.post("/api/show", json={"model": VISION_ID}).json()["capabilities"]

    r = v1.post("/chat/completions", json=chat("describe the image", image=True))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "unsupported_capability"
    assert "'vision'" in error["message"] and why in error["message"], error
    assert error["param"].startswith("messages[0].content[1]"), error

    r = v1.post("/chat/completions", json=chat("and now text"))
    assert r.status_code == 200, r.text  # the model still serves text


def test_a_projector_that_does_not_fit_the_budget_is_left_out(v1: httpx.Client, squeezed: LiveDaemon) -> None:
    check_text_only(squeezed, v1, "did not fit in the memory budget")


def test_a_projector_that_llama_cpp_refuses_is_left_out(tmp_path_factory: pytest.TempPathFactory) -> None:
    models = tmp_path_factory.mktemp("models")
    write_tiny_gguf(models / "tiny-vision.gguf", name="Tiny Vision", basename="tiny-vision", context_length=4096)
    write_tiny_mmproj_gguf(models / "mmproj-tiny-vision.gguf", text_embedding=32)  # the text model's width is 64
    live = start_daemon(models, home=tmp_path_factory.mktemp("home"))
    try:
        with httpx.Client(base_url=live.base + "/v1", timeout=120, headers=live.auth_headers) as v1:
            check_text_only(live, v1, "its vision projector did not load")
    finally:
        live.stop()
