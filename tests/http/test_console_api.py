"""What the console reads from the API besides LMSP itself: a stored turn's input items, and model
objects that say where their file is, why a file cannot be used, and what a loaded model takes."""

from __future__ import annotations

from pathlib import Path

import httpx
from gguf_factory import write_tiny_gguf
from support import ROOT, TINY_ID, body


def test_input_items_of_a_stored_turn_for_its_owner_only(client: httpx.Client, daemon) -> None:
    first = client.post("/responses", json=body("What is 2+2?", store=True, max_output_tokens=4)).json()
    second = client.post(
        "/responses",
        json=body(
            [{"role": "user", "content": "And 3+3?"}], store=True, max_output_tokens=4, previous_response_id=first["id"]
        ),
    ).json()
    items = client.get(f"/responses/{first['id']}/input_items").json()
    assert items["object"] == "list" and items["has_more"] is False
    assert [(i["type"], i["role"], i["content"][0]["text"]) for i in items["data"]] == [
        ("message", "user", "What is 2+2?")
    ]
    own = client.get(f"/responses/{second['id']}/input_items").json()["data"]
    assert [i["content"] for i in own] == ["And 3+3?"]  # this turn's own input, as sent
    assert all(i["id"] for i in items["data"] + own)
    other = client.post("/auth/tokens", json={"name": "other", "scopes": ["responses:read"]}).json()["secret"]
    r = httpx.get(
        f"{daemon.url}/responses/{first['id']}/input_items", headers={"Authorization": f"Bearer {other}"}, timeout=30
    )
    assert r.status_code == 404 and r.json()["code"] == "response_not_found"
    assert client.get("/responses/resp_nothing/input_items").status_code == 404


def test_model_objects_name_their_file_and_memory(models_dir: Path, daemon_factory) -> None:
    whole = write_tiny_gguf(models_dir / "cut-short.gguf", basename="cut-short")
    with open(whole, "r+b") as f:  # a download cut in its weights
        f.truncate(whole.stat().st_size * 9 // 10)
    live = daemon_factory()
    with httpx.Client(base_url=live.url, headers=live.auth_headers, timeout=60) as c:
        models = {m["id"]: m for m in c.get("/models").json()["data"]}
        tiny = models[TINY_ID]["extensions"]["lmsp_tray"]
        assert tiny["file_name"] == "tiny-test-1m-f32.gguf" and tiny["path"].endswith("tiny-test-1m-f32.gguf")
        assert "file_error" not in tiny and "memory_bytes" not in tiny
        [broken] = [m for m in models.values() if m["extensions"]["lmsp_tray"]["file_name"] == "cut-short.gguf"]
        assert broken["state"] == "error"
        assert broken["extensions"]["lmsp_tray"]["file_error"].startswith("incomplete file, probably a download")
        loaded = c.post(f"/models/{TINY_ID}/load").json()["extensions"]["lmsp_tray"]
        assert loaded["memory_bytes"] > 0 and loaded["gpu_memory_bytes"] == 0
        assert loaded["threads"] >= 1 and loaded["total_layers"] >= 1 and loaded["placement"].startswith("CPU")


def test_reveal_without_a_desktop_says_where_the_folder_is(client: httpx.Client, models_dir: Path) -> None:
    r = client.post("/console/reveal", json={"model": TINY_ID})
    assert r.status_code == 409 and str(models_dir) in r.json()["detail"]
    assert client.post("/console/reveal", json={"model": "no-such-model"}).status_code == 404


def test_reveal_opens_the_models_folder_through_the_desktop_hook(daemon_factory, models_dir: Path) -> None:
    from support import MemoryVault

    from lmsp_tray.config import Config, resolve_paths
    from lmsp_tray.daemon import Daemon, build_catalog

    opened: list[Path] = []
    paths = resolve_paths().ensure()
    config = Config(models_dirs=[models_dir], default_dirs=False, demo_model=False)
    daemon = Daemon(paths, config, catalog=build_catalog(paths, config), vault=MemoryVault(), reveal=opened.append)
    daemon.start_background(daemon.bind(0))
    try:
        headers = {"Authorization": f"Bearer {daemon.auth.tokens.owner_secret}"}
        r = httpx.post(f"{daemon.url}/console/reveal", json={"model": TINY_ID}, headers=headers, timeout=30)
        assert r.status_code == 200 and opened == [(models_dir / "tiny-test-1m-f32.gguf").parent]
    finally:
        daemon.stop_background()


def test_the_page_ships_with_the_package() -> None:
    """pyproject's package-data names every file of the page, so an installed wheel serves it."""
    import tomllib

    root = ROOT
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["lmsp_tray"]
    assert "console/*" in patterns
    files = [p for p in (root / "lmsp_tray" / "console").rglob("*") if p.is_file()]
    assert files and all(p.parent.name == "console" for p in files), "console/* does not reach into subfolders"
    from lmsp_tray.http.console_routes import load_assets

    assert set(load_assets()) == {p.name for p in files} | {""}
