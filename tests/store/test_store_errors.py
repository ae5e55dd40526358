"""Each layer raises its own errors: the store's exceptions, and what serving says each means to a client."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from support import body

from lmsp_tray.errors import LMSPError
from lmsp_tray.serving import storage
from lmsp_tray.store import Database, StoredResponse, stored_responses, task_rows
from lmsp_tray.store import errors as store_errors
from lmsp_tray.store.errors import (
    ChainBroken,
    ChainCycle,
    ChainTooLong,
    EventsExpired,
    KeyInProgress,
    KeyReused,
    ResponseMissing,
    StoreClosed,
    StoreError,
    TaskMissing,
    UnknownCursor,
    UnknownStatus,
)

# store exception -> (code, status, param) a client sees
MEANINGS: list[tuple[StoreError, tuple[str, int, str | None]]] = [
    (KeyReused("k"), ("idempotency_key_reused", 422, "Idempotency-Key")),
    (KeyInProgress("k"), ("idempotency_key_in_progress", 409, "Idempotency-Key")),
    (ResponseMissing("resp_1"), ("response_not_found", 404, "previous_response_id")),
    (ChainBroken("resp_2", "resp_1"), ("response_not_found", 404, "previous_response_id")),
    (ChainBroken("resp_2", None), ("response_not_found", 404, "previous_response_id")),
    (ChainTooLong("resp_2", 10), ("context_length_exceeded", 400, "previous_response_id")),
    (ChainCycle("resp_2"), ("internal_error", 500, None)),
    (EventsExpired("task_1"), ("event_history_expired", 410, None)),
    (TaskMissing("task_1"), ("task_not_found", 404, None)),
    (UnknownCursor("task_1"), ("task_not_found", 404, "after")),
    (UnknownStatus("done"), ("invalid_request", 400, "status")),
    (StoreClosed("closed"), ("internal_error", 500, None)),
    (StoreError("some failure"), ("internal_error", 500, None)),
    (store_errors.StorageFull(Path("/data/x.sqlite3")), ("insufficient_storage", 507, None)),
]


def test_store_exceptions_are_not_lmsp_errors() -> None:
    """The store knows nothing of LMSP codes or HTTP statuses (import-linter also keeps `errors` out of it)."""
    found = [
        obj
        for obj in vars(store_errors).values()
        if isinstance(obj, type) and issubclass(obj, Exception) and obj.__module__ == store_errors.__name__
    ]
    assert len(found) >= 14
    assert all(issubclass(cls, StoreError) and not issubclass(cls, LMSPError) for cls in found)
    assert {type(exc) for exc, _ in MEANINGS} >= set(found) - {
        store_errors.SchemaTooNew,
        store_errors.NotOurDatabase,
        store_errors.EventSequenceError,
        store_errors.DuplicateEvent,
    }  # those four never reach a request: start-up and the writer's own bookkeeping


@pytest.mark.parametrize(
    ("exc", "meaning"), MEANINGS, ids=lambda v: type(v).__name__ if isinstance(v, Exception) else ""
)
def test_serving_says_what_each_store_error_means(exc: StoreError, meaning: tuple[str, int, str | None]) -> None:
    error = storage.lmsp_error(exc)
    assert (error.code, error.status, error.param) == meaning
    assert error.detail[0].isupper() and error.detail.endswith(".")  # a sentence for a person, not the store's text


def test_read_and_write_raise_the_lmsp_error(tmp_path: Path) -> None:
    async def scenario(db: Database) -> None:
        with pytest.raises(LMSPError) as missing:
            await storage.read(db, stored_responses.chain, "resp_nope")
        assert missing.value.code == "response_not_found" and isinstance(missing.value.__cause__, ResponseMissing)
        with pytest.raises(LMSPError) as gone:
            await storage.write(db, task_rows.finish, "task_nope", "cancelled")
        assert gone.value.code == "task_not_found"
        saved = StoredResponse("resp_a", "m", 1.0, "completed", [], {"id": "resp_a", "output": []})
        await storage.write(db, stored_responses.save, saved)
        assert [t.response_id for t in await storage.read(db, stored_responses.chain, "resp_a")] == ["resp_a"]

    with Database(tmp_path / "store.sqlite3") as db:
        asyncio.run(scenario(db))


def test_http_answers_for_store_failures(client: httpx.Client) -> None:
    """Through the whole stack: the store raises, serving maps, http writes the problem document."""
    r = client.get("/tasks", params={"after": "task_01J8M6Q4W2T7N5R3V9X1Z8B0DF"})
    assert (r.status_code, r.json()["code"], r.json()["param"]) == (404, "task_not_found", "after")
    assert r.headers["content-type"] == "application/problem+json"
    r = client.post("/responses", json=body("x", previous_response_id="resp_01J8M6Q4W2T7N5R3V9X1Z8B0DF"))
    assert (r.status_code, r.json()["code"], r.json()["param"]) == (404, "response_not_found", "previous_response_id")
