"""The service between HTTP and a model, against a fake model: fast checks of what it promises.

A `FakeModel` (tests/fake_models.py) stands in for a model process; the test
plays the model's thread by calling the job's sink. Checked: deltas become
events in order and a finish the terminal event; a model crashing mid-stream
ends the response with `response.failed` (`model_crashed`) keeping the text so
far; the parser learns that a lazy grammar switched on from a `GrammarOn`
item in the same channel as the text (not from a flag read across threads);
once shutdown began a response still being prepared is refused; and a sink
called after the event loop closed does not raise. The real model behind
these is tested in test_http_responses.py, test_tools_http.py and
test_model_crash.py.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from fake_models import Factory, FakeModel
from gguf_factory import CHATML_TEMPLATE

from lmsp_tray.config import Config
from lmsp_tray.discovery.entry import GGUFInfo, ModelEntry
from lmsp_tray.engine.jobs import ERROR, LENGTH, STOP, Finish, GrammarOn
from lmsp_tray.engine.load_plan import LoadOptions
from lmsp_tray.engine.manager import MemoryBudget, ModelManager
from lmsp_tray.engine.trigger import CallMarkers
from lmsp_tray.errors import ModelCrashed, ServiceUnavailable
from lmsp_tray.protocol.requests import parse_response_create
from lmsp_tray.serving.service import Service

QWEN_LIKE = CHATML_TEMPLATE.replace("{% for message", "{% if tools %}<tools>{% endif %}{% for message")


class Catalog:
    def __init__(self, *entries: ModelEntry) -> None:
        self._entries = {e.id: e for e in entries}

    def entries(self) -> list[ModelEntry]:
        return list(self._entries.values())

    def resolve(self, name: str) -> ModelEntry | None:
        return self._entries.get(name)


def entry(model_id: str = "fake", template: str = CHATML_TEMPLATE) -> ModelEntry:
    info = GGUFInfo(architecture="qwen3", context_length=4096, block_count=4, chat_template=template)
    return ModelEntry(model_id, Path(f"/models/{model_id}.gguf"), "custom", 1 << 20, (), info)


@pytest.fixture
def factory() -> Factory:
    return Factory()


@pytest.fixture
def service(factory: Factory) -> Service:
    models = ModelManager(None, LoadOptions(parallel=2), budget=MemoryBudget(), factory=factory, cores=2)
    yield Service(config=Config(), catalog=Catalog(entry(), entry("tools", QWEN_LIKE)), models=models)
    models.close()


def request(**body):
    return parse_response_create({"model": "fake", "input": "hello", "stream": True, **body})


async def collect(run) -> list:
    return [event async for event in run.events()]


def from_thread(fn) -> None:
    threading.Thread(target=fn).start()


def test_deltas_become_events_and_the_finish_ends_the_response(service: Service, factory: Factory) -> None:
    async def main() -> list:
        run = await service.start_response(request())
        job = factory.made[0].jobs[0]
        assert job.prompt  # rendered and tokenized off the loop
        from_thread(lambda: [job.sink("Hel"), job.sink("lo"), job.sink(Finish(LENGTH, len(job.prompt), 2))])
        return await collect(run)

    events = asyncio.run(main())
    names = [e.name for e in events]
    assert names[0] == "response.created" and names[-1] == "response.incomplete"
    assert "".join(e.data["delta"] for e in events if e.name == "response.output_text.delta") == "Hello"


def test_a_model_crash_mid_stream_is_a_failed_response_keeping_its_text(service: Service, factory: Factory) -> None:
    async def main() -> list:
        run = await service.start_response(request())
        job = factory.made[0].jobs[0]
        crash = ModelCrashed("The model 'fake' stopped: the model process was killed (SIGKILL).")
        from_thread(lambda: [job.sink("partial "), job.sink(Finish(ERROR, len(job.prompt), 0, error=crash))])
        return await collect(run)

    events = asyncio.run(main())
    last = events[-1]
    assert last.name == "response.failed" and last.data["error"]["code"] == "model_crashed"
    assert last.data["response"]["output"][0]["content"][0]["text"] == "partial "


@pytest.mark.parametrize("switched_on", [True, False])
def test_the_parser_hears_that_the_lazy_grammar_switched_on_in_order(
    service: Service, factory: Factory, switched_on: bool
) -> None:
    tool = {
        "type": "function",
        "name": "get",
        "parameters": {"type": "object", "properties": {"a": {"type": "string"}}},
    }
    pieces = ['<tool_call>\n{"name": "get", "arguments": {', '"a": ', '"x"', "}}\n</tool_call>"]

    async def main() -> list:
        run = await service.start_response(request(model="tools", tools=[tool], tool_choice="auto"))
        job = factory.made[0].jobs[0]
        assert isinstance(job.grammar_trigger, CallMarkers) and job.grammar_trigger.roots  # sent as data
        root = job.grammar_trigger.roots[0]

        def model_thread() -> None:
            job.sink("Let me look. ")
            if switched_on:
                job.sink(GrammarOn(root))  # before the marker's text, as the scheduler sends it
            for piece in pieces:
                job.sink(piece)
            job.sink(Finish(STOP, len(job.prompt), 20))

        from_thread(model_thread)
        return await collect(run)

    events = asyncio.run(main())
    deltas = [e.data["delta"] for e in events if e.name == "response.function_call_arguments.delta"]
    final = events[-1].data["response"]
    call = next(item for item in final["output"] if item["type"] == "function_call")
    assert call["name"] == "get" and call["arguments"] == '{"a": "x"}' == "".join(deltas)
    # A constrained call streams its arguments as they come; an unconstrained one is checked whole first.
    assert len(deltas) >= 3 if switched_on else len(deltas) == 1


def test_a_response_being_prepared_when_shutdown_begins_is_refused(service: Service, factory: Factory) -> None:
    async def main() -> None:
        service.cancel_all()  # shutdown began
        with pytest.raises(ServiceUnavailable):
            await service.start_response(request())

    asyncio.run(main())
    job = factory.made[0].jobs[0]
    assert job.cancelled  # the model was told at once


def test_a_sink_called_after_the_loop_closed_does_not_raise(service: Service, factory: Factory) -> None:
    async def main():
        run = await service.start_response(request())
        return run, factory.made[0].jobs[0]

    loop = asyncio.new_event_loop()
    _, job = loop.run_until_complete(main())
    loop.close()
    job.sink("late text")  # the model's thread, after shutdown: nothing to deliver to, nothing raised
    job.sink(Finish(LENGTH, 1, 1))
    assert isinstance(factory.made[0], FakeModel)
