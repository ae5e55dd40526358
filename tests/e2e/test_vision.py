"""Images through every API, evaluated by llama.cpp's multimodal library in the model process (issue 25).

A tiny generated text model and its tiny generated projector (`gguf_factory.write_tiny_vision_pair`)
are loaded for real; the same files, image and prompt give the same greedy tokens through lmsp-tray as
through `llama-server --mmproj` (built from the same vendored llama.cpp).
"""

from __future__ import annotations

import base64
import io
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from gguf_factory import write_tiny_vision_pair
from PIL import Image
from support import TINY_ID, LiveDaemon, llama_server

VISION_ID = "tiny-vision:1m-f32"
PROMPT = "describe the image"


def png(seed: int = 1, size: tuple[int, int] = (150, 100), mode: str = "RGB") -> bytes:
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4}[mode]
    pixels = rng.integers(0, 255, (size[1], size[0], channels), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, mode).save(out, "PNG")
    return out.getvalue()


def data_url(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64," + base64.b64encode(data).decode()


def chat_body(image: bytes, text: str = PROMPT, *, model: str = VISION_ID, tokens: int = 12) -> dict[str, Any]:
    content = [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": data_url(image)}}]
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": tokens,
        "temperature": 0,
    }


@pytest.fixture(scope="module")
def vision_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_tiny_vision_pair(tmp_path_factory.mktemp("vision"))


@pytest.fixture(scope="module")
def live_files(vision_pair: tuple[Path, Path], tiny_gguf: Path) -> list[Path]:
    return [*vision_pair, tiny_gguf]


@pytest.fixture
def v1(live: LiveDaemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.base + "/v1", timeout=120, headers=live.auth_headers) as c:
        yield c


def test_listed_with_vision_and_the_projector_is_not_a_model(v1: httpx.Client, live: LiveDaemon) -> None:
    models = {m["id"]: m for m in v1.get("/models").json()["data"]}
    assert "vision" in models[VISION_ID]["capabilities"]
    assert "vision" not in models[TINY_ID]["capabilities"]
    assert not [m for m in models if "mmproj" in m]
    with httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as c:
        lmsp = c.get(f"/models/{VISION_ID}").json()
    assert lmsp["extensions"]["lmsp_tray"]["input_modalities"] == ["text", "image"]
    assert "vision" not in lmsp["capabilities"]  # LMSP 1.0 fixes the capability names
    with httpx.Client(base_url=live.base, timeout=60, headers=live.auth_headers) as c:
        shown = c.post("/api/show", json={"model": VISION_ID}).json()
    assert "vision" in shown["capabilities"]


def test_same_greedy_tokens_as_llama_server(v1: httpx.Client, vision_pair: tuple[Path, Path]) -> None:
    model, projector = vision_pair
    image = png(3)
    ours = v1.post("/chat/completions", json=chat_body(image, tokens=16))
    assert ours.status_code == 200, ours.text
    with llama_server(model, "--mmproj", str(projector), "-c", "4096", "-np", "1", "--no-warmup") as base:
        body = chat_body(image, tokens=16)
        theirs = httpx.post(base + "/v1/chat/completions", json={**body, "model": model.name}, timeout=120).json()
    mine = ours.json()
    assert mine["choices"][0]["message"]["content"] == theirs["choices"][0]["message"]["content"]
    assert mine["usage"]["prompt_tokens"] == theirs["usage"]["prompt_tokens"]


def test_a_follow_up_turn_reuses_the_image(v1: httpx.Client) -> None:
    image = png(4)
    first = v1.post("/chat/completions", json=chat_body(image, tokens=4)).json()
    answer = first["choices"][0]["message"]["content"]
    body = chat_body(image, tokens=4)
    body["messages"] += [{"role": "assistant", "content": answer}, {"role": "user", "content": "and more?"}]
    second = v1.post("/chat/completions", json=body).json()
    image_tokens = 784
    assert first["usage"]["prompt_tokens"] > image_tokens
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= first["usage"]["prompt_tokens"] - 1
    # another image at the same place: the text before it is reused, the image is not
    other = v1.post("/chat/completions", json=chat_body(png(5), tokens=4)).json()
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] < image_tokens


def test_openai_sdk_chat_and_responses(live: LiveDaemon) -> None:
    import openai

    image = data_url(png(6))
    with openai.OpenAI(base_url=live.base + "/v1", api_key=live.owner_token, max_retries=0) as client:
        chat = client.chat.completions.create(
            model=VISION_ID,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": PROMPT},
                        {"type": "image_url", "image_url": {"url": image, "detail": "low"}},
                    ],
                }
            ],
            max_tokens=6,
            temperature=0,
        )
        assert chat.choices[0].message.content
        assert chat.usage is not None and chat.usage.prompt_tokens > 784
        response = client.responses.create(
            model=VISION_ID,
            input=[
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": PROMPT},
                        {"type": "input_image", "image_url": image, "detail": "auto"},
                    ],
                }
            ],
            max_output_tokens=6,
            temperature=0,
        )
        assert response.output_text
        assert response.usage is not None and response.usage.input_tokens > 784
    with openai.OpenAI(base_url=live.url, api_key=live.owner_token, max_retries=0) as lmsp:
        again = lmsp.responses.create(
            model=VISION_ID,
            input=[{"role": "user", "content": [{"type": "input_image", "image_url": image}]}],
            max_output_tokens=4,
            temperature=0,
        )
        assert again.usage is not None and again.usage.input_tokens > 784


def test_anthropic_sdk_image_block(live: LiveDaemon) -> None:
    import anthropic

    data = base64.b64encode(png(7)).decode()
    content: Any = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}},
        {"type": "text", "text": PROMPT},
    ]
    with anthropic.Anthropic(base_url=live.base, api_key=live.owner_token, max_retries=0, timeout=120) as client:
        message = client.messages.create(
            model=VISION_ID,
            max_tokens=6,
            messages=[{"role": "user", "content": content}],
        )
        counted = client.messages.count_tokens(model=VISION_ID, messages=[{"role": "user", "content": content}])
    assert message.usage.input_tokens > 784
    # the image counted as its 784 tokens, not one (Anthropic's input_tokens leave out what the cache read)
    assert counted.input_tokens == message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)
    assert message.content and message.content[0].type == "text"


def test_ollama_client_images(live: LiveDaemon) -> None:
    import ollama

    client = ollama.Client(host=live.base, headers=live.auth_headers)
    try:
        reply = client.chat(
            model=VISION_ID,
            messages=[{"role": "user", "content": PROMPT, "images": [png(8)]}],
            options={"temperature": 0, "num_predict": 6},
        )
    finally:
        client._client.close()
    assert reply.prompt_eval_count is not None and reply.prompt_eval_count > 784
    assert reply.message.content


def bomb() -> bytes:
    """A PNG of a few kilobytes that claims 30000 x 30000 pixels (a decompression bomb)."""
    width = height = 30000
    raw = zlib.compress(b"\0" * (1 + width // 8) * height, 9)

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return len(data).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")

    header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([1, 0, 0, 0, 0])
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", raw) + chunk(b"IEND", b"")


def huge() -> bytes:
    out = io.BytesIO()
    Image.new("1", (20000, 20000)).save(out, "PNG")
    return out.getvalue()


@pytest.mark.parametrize(
    ("case", "url", "says"),
    [
        ("truncated PNG", data_url(png(9)[:300]), "could not be decoded"),
        ("20000x20000", data_url(huge()), "pixels"),
        ("decompression bomb", data_url(bomb()), "pixels"),
        ("not an image", data_url(b"hello, this is text"), "not an image"),
        ("http URL", "http://example.com/cat.png", "not fetched"),
        ("file URL", "file:///etc/passwd", "not fetched"),
        ("not base64", "data:image/png;base64,@@@", "base64"),
    ],
)
def test_bad_images_are_400_and_the_model_keeps_serving(v1: httpx.Client, case: str, url: str, says: str) -> None:
    body = chat_body(b"")
    body["messages"][0]["content"][1]["image_url"]["url"] = url
    r = v1.post("/chat/completions", json=body)
    assert r.status_code == 400, (case, r.text)
    error = r.json()["error"]
    assert says in error["message"], (case, error)
    assert error["param"].startswith("messages[0].content[1]"), (case, error)
    after = v1.post("/chat/completions", json=chat_body(png(10), tokens=2))
    assert after.status_code == 200, after.text


def test_a_text_only_model_refuses_images_naming_the_capability(v1: httpx.Client) -> None:
    r = v1.post("/chat/completions", json=chat_body(png(11), model=TINY_ID))
    assert r.status_code == 400
    error = r.json()["error"]
    assert "vision" in error["message"] and error["code"] == "unsupported_capability"


@pytest.fixture
def model_files(vision_pair: tuple[Path, Path]) -> list[Path]:
    return list(vision_pair)


def test_a_conversation_with_an_image_resumes_from_disk_after_an_unload(daemon_factory) -> None:
    live = daemon_factory(keep_alive=None, parallel=1)
    image = png(12)
    with httpx.Client(base_url=live.base + "/v1", timeout=120, headers=live.auth_headers) as v1:
        first = v1.post("/chat/completions", json=chat_body(image, tokens=4)).json()
        with httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as lmsp:
            lmsp.post(f"/models/{VISION_ID}/unload").raise_for_status()  # the state is written as it unloads
            assert lmsp.get(f"/models/{VISION_ID}").json()["extensions"]["lmsp_tray"]["prompt_cache_bytes"] > 0
        body = chat_body(image, tokens=4)
        answer = first["choices"][0]["message"]["content"]
        body["messages"] += [{"role": "assistant", "content": answer}, {"role": "user", "content": "more?"}]
        again = v1.post("/chat/completions", json=body).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= first["usage"]["prompt_tokens"] - 1
