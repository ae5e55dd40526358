"""Audio input on a model whose projector has an audio encoder, evaluated by llama.cpp's multimodal
library in the model process (issue 25, item 3).

A tiny generated text model and its tiny generated audio projector (`gguf_factory.write_tiny_audio_pair`,
Ultravox's layout) are loaded for real; the same files, WAV and prompt give the same greedy text and
prompt token count through lmsp-tray as through `llama-server --mmproj`.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gguf_factory import tone_wav, write_tiny_audio_pair, write_tiny_vision_pair
from support import TINY_ID, LiveDaemon, llama_server

AUDIO_ID = "tiny-audio:1m-f32"
VISION_ID = "tiny-vision:1m-f32"
PROMPT = "what is said?"
WINDOW_TOKENS = 150  # one 30 s window of audio on the generated projector


def audio_part(data: bytes, fmt: str = "wav") -> dict[str, Any]:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}


def chat_body(audio: bytes, text: str = PROMPT, *, model: str = AUDIO_ID, tokens: int = 12) -> dict[str, Any]:
    content = [{"type": "text", "text": text}, audio_part(audio)]
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": tokens,
        "temperature": 0,
    }


@pytest.fixture(scope="module")
def audio_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_tiny_audio_pair(tmp_path_factory.mktemp("audio"))


@pytest.fixture(scope="module")
def live_files(audio_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> list[Path]:
    return [*audio_pair, *write_tiny_vision_pair(tmp_path_factory.mktemp("vision")), tiny_gguf]


@pytest.fixture
def v1(live: LiveDaemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.base + "/v1", timeout=120, headers=live.auth_headers) as c:
        yield c


def test_listed_with_audio(v1: httpx.Client, live: LiveDaemon) -> None:
    models = {m["id"]: m for m in v1.get("/models").json()["data"]}
    assert "audio" in models[AUDIO_ID]["capabilities"] and "vision" not in models[AUDIO_ID]["capabilities"]
    assert "audio" not in models[VISION_ID]["capabilities"]
    assert not [m for m in models if "mmproj" in m]
    with httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as c:
        lmsp = c.get(f"/models/{AUDIO_ID}").json()
    assert lmsp["extensions"]["lmsp_tray"]["input_modalities"] == ["text", "audio"]
    with httpx.Client(base_url=live.base, timeout=60, headers=live.auth_headers) as c:
        shown = c.post("/api/show", json={"model": AUDIO_ID}).json()
    assert "audio" in shown["capabilities"]


def test_same_greedy_text_as_llama_server(v1: httpx.Client, audio_pair: tuple[Path, Path]) -> None:
    model, projector = audio_pair
    audio = tone_wav(1.0, hertz=330)
    body = chat_body(audio, tokens=16)
    body["messages"][0]["content"].append({"type": "text", "text": "answer briefly"})
    ours = v1.post("/chat/completions", json=body)
    assert ours.status_code == 200, ours.text
    with llama_server(model, "--mmproj", str(projector), "-c", "4096", "-np", "1", "--no-warmup") as base:
        theirs = httpx.post(base + "/v1/chat/completions", json={**body, "model": model.name}, timeout=120).json()
    mine = ours.json()
    assert mine["choices"][0]["message"]["content"] == theirs["choices"][0]["message"]["content"]
    assert mine["usage"]["prompt_tokens"] == theirs["usage"]["prompt_tokens"]
    assert mine["usage"]["prompt_tokens"] > WINDOW_TOKENS


def vendored_mp3() -> bytes:
    """llama.cpp's own test MP3 (tools/mtmd/test-2.mp3 in the vendored sources the benchmarks' llama-server is
    built from): a real encoder's file, which this test suite cannot make."""
    import importlib.metadata
    import os

    version = importlib.metadata.version("llama_cpp_python")
    cache = Path(os.environ.get("LMSP_BENCH_CACHE", Path(__file__).parents[2] / ".bench-cache"))
    path = cache / f"llama-cpp-python-{version}/vendor/llama.cpp/tools/mtmd/test-2.mp3"
    if not path.is_file():
        if os.environ.get("LMSP_REQUIRE_LLAMA_SERVER") == "1":
            pytest.fail(f"{path} is missing")
        pytest.skip(f"llama.cpp's sources are not unpacked ({path})")
    return path.read_bytes()


def test_an_mp3_as_llama_server_reads_it(v1: httpx.Client, audio_pair: tuple[Path, Path]) -> None:
    model, projector = audio_pair
    body = chat_body(vendored_mp3(), tokens=8)
    body["messages"][0]["content"][1]["input_audio"]["format"] = "mp3"
    ours = v1.post("/chat/completions", json=body)
    assert ours.status_code == 200, ours.text
    with llama_server(model, "--mmproj", str(projector), "-c", "4096", "-np", "1", "--no-warmup") as base:
        theirs = httpx.post(base + "/v1/chat/completions", json={**body, "model": model.name}, timeout=120).json()
    assert ours.json()["choices"][0]["message"]["content"] == theirs["choices"][0]["message"]["content"]
    assert ours.json()["usage"]["prompt_tokens"] == theirs["usage"]["prompt_tokens"]


def test_a_follow_up_turn_reuses_the_audio(v1: httpx.Client) -> None:
    audio = tone_wav(1.0, hertz=550)
    first = v1.post("/chat/completions", json=chat_body(audio, tokens=4)).json()
    answer = first["choices"][0]["message"]["content"]
    body = chat_body(audio, tokens=4)
    body["messages"] += [{"role": "assistant", "content": answer}, {"role": "user", "content": "and more?"}]
    second = v1.post("/chat/completions", json=body).json()
    assert first["usage"]["prompt_tokens"] > WINDOW_TOKENS
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= first["usage"]["prompt_tokens"] - 1
    # other audio at the same place: the text before it is reused, the audio is not
    other = v1.post("/chat/completions", json=chat_body(tone_wav(1.0, hertz=660), tokens=4)).json()
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] < WINDOW_TOKENS


def test_openai_sdk_chat_input_audio(live: LiveDaemon) -> None:
    import openai

    part = audio_part(tone_wav(0.5))
    with openai.OpenAI(base_url=live.base + "/v1", api_key=live.owner_token, max_retries=0) as client:
        chat = client.chat.completions.create(
            model=AUDIO_ID,
            messages=[{"role": "user", "content": [{"type": "text", "text": PROMPT}, part]}],  # type: ignore[list-item]
            max_tokens=4,
            temperature=0,
        )
    assert chat.choices[0].message.content
    assert chat.usage is not None and chat.usage.prompt_tokens > WINDOW_TOKENS


def test_input_audio_on_lmsp_responses(live: LiveDaemon) -> None:
    """The console's path: /lmsp/v1/responses takes input_audio parts (an extension of LMSP 1.0)."""
    body = {
        "model": AUDIO_ID,
        "input": [{"role": "user", "content": [{"type": "input_text", "text": PROMPT}, audio_part(tone_wav(0.3))]}],
        "max_output_tokens": 3,
        "temperature": 0,
    }
    with httpx.Client(base_url=live.url, timeout=120, headers=live.auth_headers) as c:
        r = c.post("/responses", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["input_tokens"] > WINDOW_TOKENS


def riff(fmt: bytes, data: bytes, claimed: int | None = None) -> bytes:
    body = b"WAVE" + b"fmt " + len(fmt).to_bytes(4, "little") + fmt
    body += b"data" + (len(data) if claimed is None else claimed).to_bytes(4, "little") + data
    return b"RIFF" + len(body).to_bytes(4, "little") + body


PCM16 = (1).to_bytes(2, "little") + (1).to_bytes(2, "little") + (16000).to_bytes(4, "little")
PCM16 += (32000).to_bytes(4, "little") + (2).to_bytes(2, "little") + (16).to_bytes(2, "little")


def flac_claiming(samples: int, rate: int = 16000) -> bytes:
    """A FLAC header whose STREAMINFO claims `samples` samples (mono, 16 bits), and no audio after it."""
    packed = (rate << 44) | (0 << 41) | (15 << 36) | samples
    info = (4096).to_bytes(2, "big") * 2 + b"\0" * 6 + packed.to_bytes(8, "big") + b"\0" * 16
    return b"fLaC" + bytes([0x80]) + len(info).to_bytes(3, "big") + info


@pytest.mark.parametrize(
    ("case", "data", "says"),
    [
        ("truncated WAV", tone_wav(1.0)[:5000], "cut short"),
        ("no data chunk", tone_wav(1.0)[:36], "cut short or not valid"),
        ("hours claimed", riff(PCM16, b"\0" * 64, claimed=0xFFFFFFF0), "cut short"),
        ("empty WAV", riff(PCM16, b""), "no samples"),
        ("FLAC claiming ten hours", flac_claiming(16000 * 36000), "minutes long"),
        ("not audio", b"hello, this is text, not a sound", "not audio"),
        ("a PNG", b"\x89PNG\r\n\x1a\n" + b"\0" * 64, "not audio"),
        ("MP3 sync bytes then garbage", b"\xff\xfb" + b"\x13" * 4000, "could not be decoded"),
        ("an hour of 8 kbit/s MP3", b"\xff\xf3\x18\xc4" + b"\0" * (3600 * 1000), "minutes long"),
        ("ID3 tag, then no frame", b"ID3\x04\0\0\0\0\0\x05" + b"\0" * 64, "no frame"),
    ],
)
def test_bad_audio_is_400_and_the_model_keeps_serving(v1: httpx.Client, case: str, data: bytes, says: str) -> None:
    r = v1.post("/chat/completions", json=chat_body(data))
    assert r.status_code == 400, (case, r.text)
    error = r.json()["error"]
    assert says in error["message"], (case, error)
    assert error["param"].startswith("messages[0].content[1]"), (case, error)
    after = v1.post("/chat/completions", json=chat_body(tone_wav(0.2), tokens=2))
    assert after.status_code == 200, after.text


def test_not_base64_and_an_unknown_format_are_400(v1: httpx.Client) -> None:
    body = chat_body(b"")
    body["messages"][0]["content"][1]["input_audio"]["data"] = "@@@"
    r = v1.post("/chat/completions", json=body)
    assert r.status_code == 400 and "base64" in r.json()["error"]["message"]
    body = chat_body(tone_wav(0.2))
    body["messages"][0]["content"][1]["input_audio"]["format"] = "ogg"
    r = v1.post("/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[1].format"


@pytest.mark.parametrize("model", [TINY_ID, VISION_ID])
def test_a_model_without_an_audio_encoder_refuses_audio(v1: httpx.Client, model: str) -> None:
    r = v1.post("/chat/completions", json=chat_body(tone_wav(0.2), model=model))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "'audio'" in error["message"] and error["code"] == "unsupported_capability"
    assert error["param"] == "messages[0].content[1]"


def transcribe(client: httpx.Client, audio: bytes, **fields: str) -> httpx.Response:
    form = {"model": AUDIO_ID, "max_tokens": "8", **fields}
    return client.post("/audio/transcriptions", data=form, files={"file": ("clip.wav", audio, "audio/wav")})


def test_transcription_as_llama_server_answers_it(v1: httpx.Client, audio_pair: tuple[Path, Path]) -> None:
    model, projector = audio_pair
    audio = tone_wav(1.0, hertz=250)
    ours = transcribe(v1, audio, language="en", temperature="0")
    assert ours.status_code == 200, ours.text
    with llama_server(model, "--mmproj", str(projector), "-c", "4096", "-np", "1", "--no-warmup") as base:
        form = {"model": model.name, "max_tokens": "8", "language": "en", "temperature": "0"}
        theirs = httpx.post(base + "/v1/audio/transcriptions", data=form, files={"file": ("a.wav", audio)}, timeout=120)
    assert theirs.status_code == 200, theirs.text
    assert ours.json()["text"] == theirs.json()["text"]
    assert ours.json()["usage"]["input_tokens"] > WINDOW_TOKENS


def test_openai_sdk_transcriptions(live: LiveDaemon) -> None:
    import openai

    audio = tone_wav(0.5, hertz=700)
    with openai.OpenAI(base_url=live.base + "/v1", api_key=live.owner_token, max_retries=0) as client:
        done = client.audio.transcriptions.create(
            model=AUDIO_ID, file=("clip.wav", audio, "audio/wav"), extra_body={"max_tokens": 6}
        )
        text = client.audio.transcriptions.create(
            model=AUDIO_ID, file=("clip.wav", audio), response_format="text", extra_body={"max_tokens": 6}
        )
        assert done.text and text == done.text  # greedy by default, as OpenAI's transcriptions are
        with pytest.raises(openai.BadRequestError) as refused:
            client.audio.transcriptions.create(model=TINY_ID, file=("clip.wav", audio))
    assert refused.value.code == "unsupported_capability" and "'audio'" in refused.value.message


@pytest.mark.parametrize(
    ("case", "send", "param"),
    [
        ("no file", {"data": {"model": AUDIO_ID}, "files": {"audio": ("a.wav", tone_wav(0.1))}}, "file"),
        ("not audio", {"data": {"model": AUDIO_ID}, "files": {"file": ("a.wav", b"plain text, no sound")}}, "file"),
        ("srt", {"data": {"model": AUDIO_ID, "response_format": "srt"}, "files": {"file": ("a.wav", b"x")}}, None),
        ("json body", {"json": {"model": AUDIO_ID}}, None),
        ("no model", {"data": {}, "files": {"file": ("a.wav", tone_wav(0.1))}}, "model"),
    ],
)
def test_bad_transcription_requests_are_400(v1: httpx.Client, case: str, send: dict[str, Any], param: str) -> None:
    r = v1.post("/audio/transcriptions", **send)
    assert r.status_code == 400, (case, r.text)
    error = r.json()["error"]
    if param is not None:
        assert error["param"] == param, (case, error)


@pytest.fixture
def model_files(audio_pair: tuple[Path, Path]) -> list[Path]:
    return list(audio_pair)


def test_a_conversation_with_audio_resumes_from_disk_after_an_unload(daemon_factory) -> None:
    live = daemon_factory(keep_alive=None, parallel=1)
    audio = tone_wav(31.0, hertz=480)  # two 30 s windows: 300 tokens, enough for the prompt cache to keep
    with httpx.Client(base_url=live.base + "/v1", timeout=120, headers=live.auth_headers) as v1:
        first = v1.post("/chat/completions", json=chat_body(audio, tokens=4)).json()
        with httpx.Client(base_url=live.url, timeout=60, headers=live.auth_headers) as lmsp:
            lmsp.post(f"/models/{AUDIO_ID}/unload").raise_for_status()  # the state is written as it unloads
            assert lmsp.get(f"/models/{AUDIO_ID}").json()["extensions"]["lmsp_tray"]["prompt_cache_bytes"] > 0
        body = chat_body(audio, tokens=4)
        answer = first["choices"][0]["message"]["content"]
        body["messages"] += [{"role": "assistant", "content": answer}, {"role": "user", "content": "more?"}]
        again = v1.post("/chat/completions", json=body).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= first["usage"]["prompt_tokens"] - 1
    assert first["usage"]["prompt_tokens"] > 2 * WINDOW_TOKENS
