"""What tasks and `POST /responses` need of the service: check a request, start a response, read its run.

Why a protocol: `TaskManager` is a state machine — queued, in progress, ended
(completed, incomplete, failed, cancelled), with cancellation, shutdown, the
429 back-off and store failures — whose logic does not depend on llama.cpp.
A fake service that plays scripted runs tests it in milliseconds
(tests/test_tasks_fake.py, as Ollama's sched_test.go fakes its runner), while
the end-to-end task tests keep running it on real models. `service.Service`
and `service.ResponseRun` are the real implementations.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from lmsp_tray.errors import LMSPError
from lmsp_tray.protocol.events import Event, ResponseAssembler
from lmsp_tray.protocol.requests import ResponseRequest


class Run(Protocol):
    """One running response: its events, from `response.created` to exactly one terminal event."""

    assembler: ResponseAssembler  # the response object as far as the events went
    error: LMSPError | None  # how it failed, once it has

    @property
    def response_id(self) -> str: ...

    def cancel(self, error: LMSPError | None = None) -> None:
        """Stop within one step: the run ends `cancelled`, or `failed` with ``error``."""
        ...

    def events(self) -> AsyncIterator[Event]: ...


class Responses(Protocol):
    """The service as tasks and the responder use it."""

    async def check_request(self, request: ResponseRequest) -> None:
        """Raise the LMSP error a request would fail with before its first event (nothing is loaded)."""
        ...

    async def start_response(self, request: ResponseRequest, *, response_id: str | None = None) -> Run:
        """Everything that can fail before the first event; raises its LMSP error (429 when the line is full)."""
        ...
