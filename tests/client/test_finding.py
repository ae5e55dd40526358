"""Finding this home's running service: the lock holder's URL, else the discovery file, only if it answers."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_http import LocalHTTP

from lmsp_tray.client.finding import NothingAnswers, answers, find_root, find_running
from lmsp_tray.client.loopback import NotLoopback
from lmsp_tray.config import Paths, resolve_paths

SERVICE_DOC = (200, {"Content-Type": "application/json"}, b'{"object": "service"}')


@pytest.fixture
def service() -> Iterator[LocalHTTP]:
    served = LocalHTTP({"/lmsp/v1": SERVICE_DOC, "/other": (200, {}, b'{"object": "list"}')})
    yield served
    served.close()


@pytest.fixture
def paths(lmsp_home: Path) -> Paths:
    return resolve_paths()


def publish(path: Path, url: str, pid: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"role": "service", "pid": pid, "url": url}), encoding="utf-8")


def test_answers_only_for_a_service_document(service: LocalHTTP) -> None:
    assert answers(service.url + "/lmsp/v1")
    assert not answers(service.url + "/other") and not answers(service.url + "/missing")


def test_found_through_instance_json_else_the_discovery_file(service: LocalHTTP, paths: Paths) -> None:
    assert find_running(paths) is None
    publish(paths.discovery_file, service.url + "/lmsp/v1", os.getpid())
    found = find_running(paths)
    assert found is not None and found.url == service.url + "/lmsp/v1"
    publish(paths.data_dir / "instance.json", service.url + "/other", os.getpid())  # does not answer
    found = find_running(paths)
    assert found is not None and found.url == service.url + "/lmsp/v1"


def test_a_dead_pid_is_not_asked(service: LocalHTTP, paths: Paths) -> None:
    publish(paths.discovery_file, service.url + "/lmsp/v1", 2**22 + 12345)  # beyond any pid_max default
    assert find_running(paths) is None and service.seen == []


def test_find_root_given_default_and_refused(service: LocalHTTP, paths: Paths) -> None:
    assert find_root(service.url + "/v1", default_url="http://127.0.0.1:9") == service.url
    assert find_root(None, default_url=service.url) == service.url
    with pytest.raises(NothingAnswers) as nothing:
        find_root(service.url + "/missing", default_url=service.url)
    assert nothing.value.where == service.url + "/missing"
    with pytest.raises(NotLoopback):
        find_root("http://192.0.2.1:7373/v1", default_url=service.url)
    assert [s.path for s in service.seen] == ["/lmsp/v1", "/lmsp/v1", "/missing/lmsp/v1"]
