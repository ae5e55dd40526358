"""A model's own settings (`[models."<id>"]` in config.toml): checked by the config's rules, written
keeping the person's other settings, applied at the model's next load (the window llama.cpp gets
really changes), defaults that requests' own parameters override, and `lmsp-tray models set`."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import httpx
import pytest
from support import TINY_ID, LiveDaemon, body

from lmsp_tray.config import ConfigError, ModelSettings, config_from_mapping
from lmsp_tray.protocol.requests import Message, ResponseRequest
from lmsp_tray.serving.model_settings import with_model_defaults

WRITTEN = """# mine
max_queue = 8  # kept
"""


@pytest.mark.parametrize(
    ("table", "setting", "says"),
    [
        ({"temprature": 1}, 'models."tiny-test:1m-f32".temprature', "did you mean 'temperature'?"),
        ({"temperature": "hot"}, 'models."tiny-test:1m-f32".temperature', "expected a number from 0 to 2"),
        ({"temperature": 2.5}, 'models."tiny-test:1m-f32".temperature', "expected a number from 0 to 2"),
        ({"top_p": 1.5}, 'models."tiny-test:1m-f32".top_p', "expected a number from 0 to 1"),
        ({"context": 0}, 'models."tiny-test:1m-f32".context', "expected a positive whole number"),
        ({"speculative": 1}, 'models."tiny-test:1m-f32".speculative', "expected true or false"),
        ({"keep-alive": "soon"}, 'models."tiny-test:1m-f32".keep_alive', "a duration like '5m'"),
        ({"draft": ""}, 'models."tiny-test:1m-f32".draft', "expected a model id"),
    ],
)
def test_bad_settings_name_the_setting_and_the_rule(table: dict, setting: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_mapping({"models": {TINY_ID: table}}, source="config.toml")
    assert caught.value.setting == setting
    assert says in str(caught.value) and str(caught.value).startswith("config.toml: ")


def test_good_settings_are_read() -> None:
    raw = '[models."tiny-test:1m-f32"]\ncontext = 256\nkeep_alive = "never"\ntemperature = 0\nsystem_prompt = "Be brief."\n'
    own = config_from_mapping(tomllib.loads(raw)).models[TINY_ID]
    assert own.context == 256 and own.keep_alive == float("inf") and own.temperature == 0.0
    assert own.system_prompt == "Be brief." and own.top_k is None


def test_request_parameters_win_over_the_model_defaults() -> None:
    own = ModelSettings(temperature=0.0, top_k=5, repeat_penalty=1.3, system_prompt="Be brief.")
    bare = with_model_defaults(ResponseRequest(model="m", items=[Message("user", "hi")]), own)
    assert (bare.temperature, bare.top_k, bare.repeat_penalty, bare.top_p) == (0.0, 5, 1.3, None)
    assert bare.items == [Message("system", "Be brief."), Message("user", "hi")]
    sent = ResponseRequest(
        model="m", items=[Message("system", "Mine."), Message("user", "hi")], temperature=0.9, top_k=0
    )
    mine = with_model_defaults(sent, own)
    assert (mine.temperature, mine.top_k, mine.repeat_penalty) == (0.9, 0, 1.3)
    assert mine.items == sent.items  # its own system message: no default one added


def _settings(client: httpx.Client, changes: dict) -> httpx.Response:
    return client.patch(f"/models/{TINY_ID}/settings", json=changes)


def test_settings_apply_at_the_next_load_and_keep_the_file(daemon_factory, lmsp_home: Path) -> None:
    live: LiveDaemon = daemon_factory()
    config_file = live.daemon.paths.config_file
    config_file.write_text(WRITTEN)
    with httpx.Client(base_url=live.url, headers=live.auth_headers, timeout=120) as client:
        loaded = client.post(f"/models/{TINY_ID}/load").json()
        assert loaded["context_length"] == 512 and loaded["extensions"]["lmsp_tray"]["parallel"] > 1
        changed = _settings(client, {"context": 256, "parallel": 1, "keep_alive": "never", "top_k": 7})
        assert changed.status_code == 200, changed.text
        shown = changed.json()["extensions"]["lmsp_tray"]["settings"]
        assert shown["values"]["context"] == 256 and shown["values"]["keep_alive"] == "never"
        assert shown["values"]["temperature"] is None and shown["applies"]["context"] == "next_load"
        text = config_file.read_text()
        assert "# mine" in text and "# kept" in text
        assert tomllib.loads(text) == {
            "max_queue": 8,
            "models": {TINY_ID: {"context": 256, "parallel": 1, "keep_alive": "never", "top_k": 7}},
        }
        # Loaded before the change: as it was, until its next load.
        assert client.get(f"/models/{TINY_ID}").json()["context_length"] == 512
        client.post(f"/models/{TINY_ID}/unload").raise_for_status()
        reloaded = client.post(f"/models/{TINY_ID}/load").json()
        assert reloaded["context_length"] == 256 and reloaded["extensions"]["lmsp_tray"]["parallel"] == 1
        assert live.daemon.models.unloads_in(TINY_ID) is None  # keep_alive "never"
        # The window the model process gave llama.cpp is the new one: 300 tokens no longer fit.
        long = client.post("/responses", json=body("word " * 300, max_output_tokens=4))
        assert long.status_code == 400 and "context window of 256 tokens" in long.json()["detail"]
        # The other model keeps the service-wide settings.
        other = client.post("/models/slow-test:4m-f32/load").json()
        assert other["context_length"] > 256
        removed = _settings(client, {"context": None, "parallel": None, "keep_alive": None, "top_k": None})
        assert removed.json()["extensions"]["lmsp_tray"]["settings"]["values"]["context"] is None
        assert tomllib.loads(config_file.read_text()) == {"max_queue": 8}


def test_bad_changes_are_refused_and_nothing_is_written(daemon_factory) -> None:
    live: LiveDaemon = daemon_factory()
    config_file = live.daemon.paths.config_file
    config_file.write_text(WRITTEN)
    with httpx.Client(base_url=live.url, headers=live.auth_headers, timeout=60) as client:
        for changes, param, says in (
            ({"temprature": 1}, "temprature", "is not a model setting"),
            ({"top_k": -1}, "top_k", "expected a whole number, 0 or more"),
            ({"repeat_penalty": 0}, "repeat_penalty", "expected a number above 0"),
            ({"system_prompt": 5}, "system_prompt", "expected a string"),
        ):
            refused = _settings(client, changes)
            assert refused.status_code == 400, refused.text
            assert refused.json()["param"] == param and says in refused.json()["detail"]
        assert client.patch("/models/no-such-model/settings", json={"top_k": 1}).status_code == 404
    assert config_file.read_text() == WRITTEN


def test_system_prompt_default_reaches_the_prompt_unless_the_request_has_one(daemon_factory) -> None:
    live: LiveDaemon = daemon_factory()
    with httpx.Client(base_url=live.url, headers=live.auth_headers, timeout=120) as client:

        def input_tokens(**extra) -> int:
            answer = client.post("/responses", json=body("hello", max_output_tokens=1, **extra))
            assert answer.status_code == 200, answer.text
            return int(answer.json()["usage"]["input_tokens"])

        plain = input_tokens()
        with_own = input_tokens(instructions="x")
        _settings(client, {"system_prompt": "You answer in one short sentence, always politely."}).raise_for_status()
        assert input_tokens() > plain + 5  # the default system prompt is in the prompt
        assert input_tokens(instructions="x") == with_own  # the request's own system message wins


def test_cli_set_round_trip(daemon_factory, lmsp_home: Path, models_dir: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LMSP_TRAY")}
    env["LMSP_TRAY_HOME"] = str(lmsp_home)
    flags = ["--models-dir", str(models_dir), "--no-default-dirs"]

    def cli(*args: str) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "lmsp_tray", "models", *flags, *args]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)

    # No service: written to config.toml here.
    done = cli("set", TINY_ID, "temperature=0.2", "system_prompt=Answer briefly", 'keep_alive="10m"')
    assert done.returncode == 0, done.stderr
    assert "apply at its next load" in done.stdout
    config_file = lmsp_home / "config" / "config.toml"
    assert tomllib.loads(config_file.read_text())["models"][TINY_ID] == {
        "temperature": 0.2,
        "system_prompt": "Answer briefly",
        "keep_alive": "10m",
    }
    bad = cli("set", TINY_ID, "top_p=3")
    assert bad.returncode == 1 and "top_p: expected a number from 0 to 1" in bad.stderr
    assert cli("set", TINY_ID, "nonsense").returncode == 2
    # A running service: the change goes through it, and it applies it.
    live: LiveDaemon = daemon_factory()
    env["LMSP_TRAY_TOKEN"] = live.owner_token
    done = cli("set", TINY_ID, "temperature=", "context=128")
    assert done.returncode == 0, done.stderr
    assert tomllib.loads(config_file.read_text())["models"][TINY_ID] == {
        "system_prompt": "Answer briefly",
        "keep_alive": "10m",
        "context": 128,
    }
    assert live.daemon.models.options_for(TINY_ID).context_cap == 128
    assert live.service.config.models[TINY_ID].temperature is None
