"""`lmsp-tray launch <agent>`: start a coding agent wired to this service, with a token of its own.

Why: pointing Claude Code or Codex CLI at a local model by hand means a token
to make and copy, a handful of variables or provider options, a model name and
a context window large enough for the agent's long prompts. This command does
it in one step, as `ollama launch` does, but with a token per agent:

1. the agent's token comes from the connect helper (`lmsp_tray.connect`): the
   one in the OS keyring under the agent's name ("Claude Code") if the service
   still takes it, else a pairing the person approves once — so the token shows
   under Apps with the agent's name and can be revoked there;
2. the model is `--model`, else `LMSP_TRAY_MODEL`, else the only text model,
   else asked on a terminal, else a clear error listing the models;
3. its window (`context_length`, sized from memory by the load planner) must
   hold the agent's first request: below it the launch is refused saying why
   and what to change; below what a working session wants (32k) it warns;
4. the agent runs with its settings (`cli.agents`) and the remaining arguments,
   and its exit status is this command's. `--print` shows the settings instead.

The token is printed only by `--print`, on stdout, as asked; never on stderr.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from lmsp_tray.cli.agents import AGENTS, Agent, Settings, Wiring, find_agent, unknown_agent
from lmsp_tray.client.loopback import request
from lmsp_tray.config import Config, Paths
from lmsp_tray.connect import API, ConnectError, connect

MODEL_ENV = "LMSP_TRAY_MODEL"


class LaunchError(Exception):
    """A failure to report as one line on stderr; `code` is the exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Model:
    id: str
    window: int  # the context window the service gives it (loaded, or when it loads)
    trained: int | None  # the window it was trained for


def _own_options() -> argparse.ArgumentParser:
    """launch's own options, read before the agent's name and again after it (up to `--`)."""
    own = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    own.add_argument("--model", help=f"the model id or alias (default: ${MODEL_ENV}, or the only one, or asked)")
    own.add_argument(
        "--print", dest="print_only", action="store_true", help="print the settings (environment and command)"
    )
    own.add_argument("--url", help="the service's URL (default: the running lmsp-tray)")
    return own


def add_parser(commands: Any) -> None:
    known = ", ".join(a.key for a in AGENTS)
    launch = commands.add_parser(
        "launch",
        parents=[_own_options()],
        allow_abbrev=False,
        help=f"start a coding agent wired to this service ({known})",
        description="Start a coding agent with a token of its own (paired once, kept in the OS keyring under "
        "the agent's name), a model and a large enough context window. Arguments after `--` go to the agent "
        "untouched, as do those launch does not know.",
    )
    launch.add_argument("agent", help=f"the agent: {known} (any other name with --print)")
    launch.add_argument("agent_args", nargs=argparse.REMAINDER, help="arguments for the agent (after --)")


def split_arguments(args: argparse.Namespace) -> list[str]:
    """Read launch's options that follow the agent's name into `args`; the agent's arguments: those
    launch does not know, then everything after `--` (`main` sets it apart as `passthrough`)."""
    _, unknown = _own_options().parse_known_args(list(args.agent_args or []), namespace=args)
    return [*unknown, *getattr(args, "passthrough", [])]


def run(paths: Paths, config: Config, args: argparse.Namespace) -> int:
    try:
        return launch(args)
    except LaunchError as exc:
        print(f"lmsp-tray: {exc}", file=sys.stderr)
        return exc.code
    except ConnectError as exc:
        print(str(exc) if str(exc).startswith("lmsp-tray") else f"lmsp-tray: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def launch(args: argparse.Namespace, *, ask: Callable[[str], str] = input) -> int:
    extra = split_arguments(args)
    agent = find_agent(args.agent)
    if agent is None:
        if not args.print_only:
            raise LaunchError(
                f"launch does not know the agent '{args.agent}'; it knows {', '.join(a.key for a in AGENTS)}. "
                f"For another agent, `lmsp-tray launch {shlex.quote(args.agent)} --print` prints the settings "
                "to copy into it (OpenAI's and Anthropic's variables, with a token of its own).",
                code=2,
            )
        agent = unknown_agent(args.agent)
    url = args.url or (f"http://127.0.0.1:{args.port}" if getattr(args, "port", None) else None)
    conn = connect(agent.app_name, agent.scopes, url=url)
    if not conn.stored:
        print(
            f"lmsp-tray: the token for {agent.app_name} could not be kept in the OS keyring; the next launch "
            "asks for approval again.",
            file=sys.stderr,
        )
    model = choose_model(conn.url, conn.token, args.model, ask=ask)
    check_window(agent, model)
    settings = agent.settings(Wiring(conn.url, conn.token, model.id), extra)
    if args.print_only or not agent.program:
        print(describe(agent, conn.url, model, settings))
        return 0
    return run_agent(agent, settings)


# -- the model -------------------------------------------------------------------------------------


def _get(root: str, token: str, path: str) -> tuple[int, Any]:
    try:
        reply = request("GET", root + API + path, token=token, timeout=60)
    except OSError as exc:
        raise LaunchError(f"lost the connection to lmsp-tray at {root}: {exc}") from None
    return reply.status, reply.doc()


def _model(doc: dict[str, Any]) -> Model:
    ext = (doc.get("extensions") or {}).get("lmsp_tray") or {}
    trained = ext.get("trained_context_length")
    return Model(str(doc["id"]), int(doc.get("context_length") or 0), int(trained) if trained else None)


def text_models(root: str, token: str) -> list[Model]:
    status, doc = _get(root, token, "/models")
    if status != 200 or not isinstance(doc, dict):
        raise LaunchError(f"lmsp-tray did not list its models ({status}).")
    return [
        _model(m)
        for m in doc.get("data", [])
        if not m.get("error") and "text" in (m.get("capabilities") or []) and m.get("state") != "error"
    ]


def _listing(models: Sequence[Model]) -> str:
    if not models:
        return "lmsp-tray has no text model; add one (`lmsp-tray pull <repo>`, or a GGUF file in a models folder)."
    return "the models: " + ", ".join(f"{m.id} ({m.window:,}-token window)" for m in models) + "."


def choose_model(root: str, token: str, wanted: str | None, *, ask: Callable[[str], str] = input) -> Model:
    """`--model`, else $LMSP_TRAY_MODEL, else the only text model, else asked on a terminal."""
    wanted = wanted or os.environ.get(MODEL_ENV, "").strip() or None
    if wanted:
        status, doc = _get(root, token, "/models/" + quote(wanted, safe=":"))
        if status == 200 and isinstance(doc, dict):
            return _model(doc)
        if status != 404:
            detail = doc.get("detail") if isinstance(doc, dict) else None
            raise LaunchError(f"lmsp-tray could not look up the model '{wanted}' ({status}): {detail or 'no details'}")
        raise LaunchError(f"there is no model '{wanted}'; {_listing(text_models(root, token))}")
    models = text_models(root, token)
    if len(models) == 1:
        return models[0]
    if models and sys.stdin.isatty() and sys.stderr.isatty():
        for number, m in enumerate(models, 1):
            print(f"  {number}. {m.id} ({m.window:,}-token window)", file=sys.stderr)
        answer = ask(f"Which model (1-{len(models)})? ").strip()
        if answer.isdigit() and 1 <= int(answer) <= len(models):
            return models[int(answer) - 1]
        chosen = next((m for m in models if m.id == answer), None)
        if chosen is not None:
            return chosen
        raise LaunchError(f"'{answer}' is not one of the models listed.", code=2)
    if not models:
        raise LaunchError(_listing(models))
    raise LaunchError(f"choose a model with --model (or ${MODEL_ENV}); {_listing(models)}", code=2)


# -- the window ------------------------------------------------------------------------------------


def check_window(agent: Agent, model: Model) -> None:
    """Refuse a window the agent's first request does not fit in; warn below what a session wants."""
    window, trained = model.window, model.trained
    limited_by_training = trained is not None and window >= trained
    target = min(agent.wants, trained) if trained else agent.wants
    if limited_by_training:
        why = f"{model.id} was trained for {window:,} tokens"
        fix = f"choose a model trained for {agent.wants:,} tokens or more"
    else:
        why = f"lmsp-tray gives {model.id} a {window:,}-token window (context_cap, or what memory holds)"
        fix = (
            f"set context_cap = {target} in config.toml (or in the console's Settings) where memory allows, "
            "or choose another model"
        )
    if window < agent.first_request:
        raise LaunchError(f"{why}; {agent.app_name}'s first request alone takes up to {agent.first_request:,}: {fix}.")
    if window < agent.wants:
        print(
            f"lmsp-tray: {why}; {agent.app_name}'s sessions grow past that (it wants {agent.wants:,}): {fix}.",
            file=sys.stderr,
        )


# -- running ---------------------------------------------------------------------------------------


def describe(agent: Agent, root: str, model: Model, settings: Settings) -> str:
    """The settings as shell lines to copy: the variables, then the command."""
    lines = [f"# {agent.app_name} on lmsp-tray at {root}: {model.id}, a {model.window:,}-token window"]
    for name, value in settings.env.items():
        lines.append(f"unset {name}" if value == "" else f"export {name}={shlex.quote(value)}")
    if settings.argv:
        lines.append(shlex.join(settings.argv))
    return "\n".join(lines)


def run_agent(agent: Agent, settings: Settings) -> int:
    """Run the agent in the foreground; its exit status is ours."""
    program = shutil.which(settings.argv[0])
    if program is None:
        raise LaunchError(
            f"{agent.app_name} is not installed: `{settings.argv[0]}` is not on PATH. Install it, or run "
            f"`lmsp-tray launch {agent.key} --print` to see its settings."
        )
    env = settings.applied(os.environ)
    argv = [program, *settings.argv[1:]]
    if os.name == "posix":  # the agent takes this process over: its terminal, its signals, its exit status
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(program, argv, env)
    return subprocess.call(argv, env=env)  # pragma: no cover - Windows
