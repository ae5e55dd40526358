"""OpenAI's `POST /v1/audio/transcriptions` as a chat request, and the transcription object it answers.

Why a module: a transcription is a chat turn on a model that takes audio — one user message holding
an instruction and the audio — so it runs through the same scheduler, prefix reuse and limits as any
chat request. It is built as llama-server builds its own (`convert_transcriptions_to_chatcmpl`): the
instruction is the request's `prompt`, else "Transcribe audio to text", with " (language: xx)"
when a `language` is named, and the audio's marker right after it; the same model, projector and file
give the same text as llama-server's route. The form's fields arrive as strings (multipart); they are
checked here, the audio's bytes by the service (`serving.audio`). Greedy decoding (temperature 0)
unless the request sets one, as OpenAI's transcriptions default to.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from lmsp_tray.errors import InvalidRequest
from lmsp_tray.protocol.images import AUDIO_FORMATS, MAX_AUDIO_BYTES, AudioInput, join_parts
from lmsp_tray.protocol.openai_chat import parse_chat_create
from lmsp_tray.protocol.requests import Message, ResponseRequest

TRANSCRIBE = "Transcribe audio to text"  # llama-server's instruction (common_chat_get_asr_prompt)
RESPONSE_FORMATS = ("json", "text")
FIELDS = ("model", "prompt", "language", "response_format", "temperature", "max_tokens", "stream")


@dataclass(frozen=True)
class Transcription:
    """A validated transcription request: the chat request it runs as, and how to answer."""

    request: ResponseRequest
    response_format: str  # "json" | "text"


def _number(fields: Mapping[str, str], name: str, kind: type[float | int]) -> float | int | None:
    value = fields.get(name)
    if value is None or value == "":
        return None
    try:
        return kind(value)
    except ValueError:
        raise InvalidRequest(f"'{name}' must be a number, not {value!r}.", param=name) from None


def parse_transcription(fields: Mapping[str, str], audio: bytes | None, filename: str = "") -> Transcription:
    """The form of a transcription request (`fields`, and the `file` part's bytes and name) as a chat
    request, or a 400 naming the field."""
    if audio is None:
        raise InvalidRequest("The form has no 'file': send the audio as the 'file' part.", param="file")
    if len(audio) > MAX_AUDIO_BYTES:
        raise InvalidRequest(f"The audio is larger than {MAX_AUDIO_BYTES >> 20} MiB.", param="file")
    response_format = fields.get("response_format") or "json"
    if response_format not in RESPONSE_FORMATS:
        raise InvalidRequest(
            f"response_format '{response_format}' is not offered: use {' or '.join(RESPONSE_FORMATS)}.",
            param="response_format",
        )
    if (fields.get("stream") or "false").lower() not in ("false", "0"):
        raise InvalidRequest("Streaming transcriptions are not offered: leave 'stream' out.", param="stream")
    instruction = fields.get("prompt") or TRANSCRIBE
    if fields.get("language"):
        instruction += f" (language: {fields['language']})"
    temperature = _number(fields, "temperature", float)
    body: dict[str, Any] = {
        "model": fields.get("model"),
        "messages": [{"role": "user", "content": instruction}],
        "temperature": 0.0 if temperature is None else temperature,
    }
    max_tokens = _number(fields, "max_tokens", int)  # llama-server's extension; not in OpenAI's form
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    chat = parse_chat_create(body)
    suffix = PurePath(filename).suffix.lower().lstrip(".")
    clip = AudioInput(audio, "file", suffix if suffix in AUDIO_FORMATS else "")
    text, media = join_parts([instruction, clip])
    request = dataclasses.replace(
        chat.request, items=[Message("user", text, media)], size=chat.request.size + len(audio)
    )
    return Transcription(request, response_format)


def transcription_object(response: dict[str, Any]) -> dict[str, Any]:
    """A finished response as OpenAI's transcription object: its text and token usage."""
    text = "".join(
        part.get("text", "")
        for item in response.get("output") or []
        if item.get("type") == "message"
        for part in item.get("content") or []
    )
    usage = response.get("usage") or {}
    tokens = {k: usage.get(k, 0) for k in ("input_tokens", "output_tokens", "total_tokens")}
    return {"text": text, "usage": {"type": "tokens", **tokens}}
