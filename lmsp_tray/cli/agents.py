"""The coding agents `lmsp-tray launch` knows: each one's name, program, window needs and settings.

Why a module of its own: what an agent must be told to talk to this service
(Claude Code reads environment variables; Codex CLI takes `-c` options on its
command line, so nothing is written into the person's own config) is a table
of facts about other programs, kept apart from the command that pairs, picks
a model and runs them (`cli.launch`). `settings` is pure: the same inputs give
the same environment and command, which `--print` shows and tests check.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

AGENT_TOKEN_ENV = "LMSP_TRAY_AGENT_TOKEN"  # where Codex reads its key (env_key): not the CLI's LMSP_TRAY_TOKEN
ROOMY_WINDOW = 32768  # what a working session wants (Ollama recommends 64k for these agents)


@dataclass(frozen=True)
class Wiring:
    """Where the agent's requests go and with what."""

    url: str  # the service's root, http://127.0.0.1:PORT
    token: str
    model: str


@dataclass(frozen=True)
class Settings:
    """What the agent is started with: variables set (an empty value unsets one) and its command line."""

    env: Mapping[str, str]
    argv: Sequence[str]
    secret_env: tuple[str, ...] = ()  # the variables that hold the token (`--print` shows them as asked)

    def applied(self, base: Mapping[str, str]) -> dict[str, str]:
        """`base` (the environment launch runs in) with these settings; empty values removed."""
        merged = {**base, **self.env}
        return {k: v for k, v in merged.items() if not (k in self.env and self.env[k] == "")}


@dataclass(frozen=True)
class Agent:
    key: str  # what the person types: `lmsp-tray launch claude`
    app_name: str  # the token's name under Apps, and the keyring entry's service
    program: str  # the executable looked up on PATH
    first_request: int  # tokens its first request takes on a real vocabulary: the smallest window it can use
    build: Callable[[Wiring, Sequence[str]], Settings]
    aliases: tuple[str, ...] = field(default=())
    wants: int = ROOMY_WINDOW  # the window a working session wants

    @property
    def scopes(self) -> tuple[str, ...]:
        return ("models:read", "responses:create")

    def settings(self, wiring: Wiring, args: Sequence[str] = ()) -> Settings:
        return self.build(wiring, args)


def claude_code(wiring: Wiring, args: Sequence[str]) -> Settings:
    """Claude Code reads its endpoint, key and models from the environment; every model it would pick
    (main, small/fast, the haiku/sonnet/opus defaults, subagents) is the one chosen."""
    models = {
        name: wiring.model
        for name in (
            "ANTHROPIC_MODEL",
            "ANTHROPIC_SMALL_FAST_MODEL",
            "ANTHROPIC_DEFAULT_HAIKU_MODEL",
            "ANTHROPIC_DEFAULT_SONNET_MODEL",
            "ANTHROPIC_DEFAULT_OPUS_MODEL",
            "CLAUDE_CODE_SUBAGENT_MODEL",
        )
    }
    env = {
        "ANTHROPIC_BASE_URL": wiring.url,
        "ANTHROPIC_AUTH_TOKEN": wiring.token,  # sent as Authorization: Bearer
        "ANTHROPIC_API_KEY": "",  # a real Anthropic key in the environment would be sent here instead
        **models,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    return Settings(env, ["claude", *args], secret_env=("ANTHROPIC_AUTH_TOKEN",))


def _toml(value: str) -> str:
    return json.dumps(value)  # a TOML basic string is a JSON string for these (ASCII, escapes)


def codex_cli(wiring: Wiring, args: Sequence[str]) -> Settings:
    """Codex CLI gets a provider of its own on its command line (`-c` options, read as TOML values):
    `wire_api = "responses"` at …/v1, its key read from `AGENT_TOKEN_ENV`. The person's own
    ~/.codex/config.toml is left as it is."""
    options = {
        "model_provider": "lmsp",
        "model": wiring.model,
        "model_providers.lmsp.name": "lmsp-tray",
        "model_providers.lmsp.base_url": wiring.url + "/v1",
        "model_providers.lmsp.env_key": AGENT_TOKEN_ENV,
        "model_providers.lmsp.wire_api": "responses",
    }
    argv = ["codex"]
    for key, value in options.items():
        argv += ["-c", f"{key}={_toml(value)}"]
    argv += ["-c", "check_for_update_on_startup=false", "-c", "analytics.enabled=false", *args]
    return Settings({AGENT_TOKEN_ENV: wiring.token}, argv, secret_env=(AGENT_TOKEN_ENV,))


def any_app(wiring: Wiring, args: Sequence[str]) -> Settings:
    """An agent launch does not know: the settings most agents take (OpenAI's and Anthropic's variables)
    to copy by hand; there is no command to run."""
    env = {
        "OPENAI_BASE_URL": wiring.url + "/v1",
        "OPENAI_API_KEY": wiring.token,
        "ANTHROPIC_BASE_URL": wiring.url,
        "ANTHROPIC_AUTH_TOKEN": wiring.token,
        "LMSP_TRAY_MODEL": wiring.model,
    }
    return Settings(env, list(args), secret_env=("OPENAI_API_KEY", "ANTHROPIC_AUTH_TOKEN"))


AGENTS = (
    # its system prompt and tools: 19,660 tokens on Gemma's vocabulary (Claude Code 2.1.197, -p), then the answer
    Agent("claude", "Claude Code", "claude", first_request=24576, build=claude_code, aliases=("claude-code",)),
    # Codex's first request: ~9,000 tokens of tools and instructions
    Agent("codex", "Codex CLI", "codex", first_request=16384, build=codex_cli, aliases=("codex-cli",)),
)


def find_agent(name: str) -> Agent | None:
    wanted = name.strip().lower()
    return next((a for a in AGENTS if wanted == a.key or wanted in a.aliases), None)


def unknown_agent(name: str) -> Agent:
    """An agent launch does not know, for `--print` only: its token carries the name as given."""
    return Agent(name.strip().lower(), name.strip(), "", first_request=8192, build=any_app)
