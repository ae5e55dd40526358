"""`lmsp-tray pull <model>`: get a GGUF model from Hugging Face, with progress, into the shared cache.

When this home's service runs, the service downloads it and this command
follows the task (`cli.pull_remote`: the tray shows the progress). Otherwise
the pull runs in this process. It prints the plan first — which
variant and why, the files and sizes, whether the model fits this machine —
then one progress line (bytes, speed, time left; a line every few seconds when
stderr is not a terminal), then the model id discovery gives it and the fit
again, read from the file. Ctrl+C stops at once and keeps what was fetched: the
same command resumes. `--list` shows a repository's variants with sizes.
Errors are one line on stderr; nothing here prints a token.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any

from lmsp_tray.cli.progress import INTERRUPTED, Printer, size
from lmsp_tray.cli.service import CommandError
from lmsp_tray.config import Config, Paths
from lmsp_tray.errors import LMSPError


def add_parser(commands: Any) -> None:
    pull = commands.add_parser(
        "pull",
        help="download a GGUF model from Hugging Face into the shared cache",
        description="Download a GGUF model from Hugging Face into the Hugging Face cache, where lmsp-tray and "
        "other tools find it. MODEL is hf.co/ORG/REPO[:QUANT], ORG/REPO[:QUANT], ORG/REPO/FILE.gguf or a "
        "https://huggingface.co/…/resolve/… URL. Without a QUANT the repository's Q4_K_M is taken when it "
        "has one. Ctrl+C keeps what was fetched; the same command resumes. Gated and private models use your "
        "Hugging Face login (`hf auth login` or HF_TOKEN).",
    )
    pull.add_argument("model", metavar="MODEL", help="the model to download, e.g. hf.co/unsloth/gemma-3-1b-it-GGUF")
    pull.add_argument(
        "--list", action="store_true", help="list the repository's GGUF variants and sizes; download nothing"
    )
    pull.add_argument(
        "--no-mmproj", action="store_true", help="leave out the projector (mmproj) a vision or audio model comes with"
    )


# -- the command --------------------------------------------------------------------------------------
def _machine_and_options(config: Config) -> tuple[Any, Any]:
    """The load planner's view of this machine, as the service would load the model."""
    from lmsp_tray.engine.load_plan import LoadOptions
    from lmsp_tray.hub.fit import Machine

    try:
        from lmsp_tray.daemon import kv_budget, load_options
        from lmsp_tray.engine.devices import probe

        devices = probe()  # a short-lived process: the CLI does not load llama.cpp either
        gpu = config.gpu != "off" and devices.has_gpu
        free = devices.gpu_free_bytes if gpu else None
        total = devices.gpu_total_bytes if gpu else None
        options = load_options(config, devices)
    except Exception:  # noqa: BLE001 - no llama.cpp here: size the model for the CPU alone
        free = total = None
        options = LoadOptions(
            context_cap=config.context_cap, parallel=config.parallel, gpu="off", kv_budget_bytes=kv_budget(config)
        )
    machine = Machine.this_one(fraction=config.memory_budget_fraction, gpu_free=free, vram_total=total)
    return machine, options


def _puller(paths: Paths, config: Config) -> Any:
    from lmsp_tray.daemon import downloads_ledger
    from lmsp_tray.discovery.sources import huggingface_hub_dir
    from lmsp_tray.hub.owned import Ledger
    from lmsp_tray.hub.pull import Puller

    machine, options = _machine_and_options(config)
    ledger = Ledger(downloads_ledger(paths))  # what this pull fetches, the service may delete
    return Puller(huggingface_hub_dir(os.environ, Path.home()), options=options, machine=lambda: machine, ledger=ledger)


def run(paths: Paths, config: Config, args: argparse.Namespace) -> int:
    try:
        if not args.list:
            from lmsp_tray.cli.pull_remote import pull_through_service, running_service

            service = running_service(paths)
            if service is not None:  # the service downloads it: the tray and the console show it
                return pull_through_service(*service, args)
        puller = _puller(paths, config)
        if args.list:
            return _list(puller, args.model)
        return _pull(paths, config, puller, args)
    except LMSPError as exc:
        print(f"lmsp-tray: {exc.detail}", file=sys.stderr)
        return 1
    except CommandError as exc:  # the running service refused the pull (a problem document, one line)
        print(f"lmsp-tray: {exc}", file=sys.stderr)
        return 1


def _list(puller: Any, model: str) -> int:
    found = puller.list_variants(model)
    listing = found.listing
    if not found.variants:
        print(f"{listing.repo_id} has no GGUF model files.")
        return 0
    default = found.default.variant.label if found.default else None
    print(f"{listing.repo_id} at {listing.commit[:12]}: {len(found.variants)} GGUF variant(s)")
    print(f"  {'TAG':<12} {'SIZE':>9}  {'FILES':<8} FIT ON THIS MACHINE")
    for v in found.variants:
        files = f"{len(v.files)} parts" if v.split else "1 file"
        fit = found.fits.get(v.label)
        note = fit.summary if fit else ""
        if v.missing_parts:
            note = f"incomplete in the repository ({v.missing_parts} part(s) missing)"
        mark = "  (default)" if v.label == default else ""
        print(f"  {v.label:<12} {size(v.size):>9}  {files:<8} {note}{mark}")
    if found.projector:
        print(f"  + {found.projector} (multimodal projector) comes along")
    example = default or found.variants[0].label
    print(f"Pull one with: lmsp-tray pull hf.co/{listing.repo_id}:{example}")
    return 0


def _pull(paths: Paths, config: Config, puller: Any, args: argparse.Namespace) -> int:
    from lmsp_tray.hub.errors import DownloadCancelled
    from lmsp_tray.hub.transfer import CancelToken

    plan = puller.plan(args.model, projector=not args.no_mmproj)
    print(f"{plan.ref}: {plan.reason}", file=sys.stderr)
    for f in plan.files:
        role = "  (multimodal projector)" if f.role == "projector" else ""
        state = "  already here" if f.present else (f"  {size(f.partial)} already fetched" if f.partial else "")
        print(f"  {f.spec.path}  {size(f.spec.size)}{role}{state}", file=sys.stderr)
    if plan.fit is not None:
        print(f"  On this machine: {plan.fit.summary}", file=sys.stderr)
    puller.check_space(plan)
    printer = Printer()
    cancel = CancelToken()
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["result"] = puller.run(plan, printer.progress, cancel)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            outcome["error"] = exc

    worker = threading.Thread(target=work, name="lmsp-pull", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.2)
    except KeyboardInterrupt:
        cancel.cancel("interrupted")
        worker.join(10)
        printer.end_line()
        kept = puller.refreshed(plan)
        fetched = sum(f.spec.size if f.present else f.partial for f in kept.files)
        print(
            f"Stopped. {size(fetched)} of {size(kept.total_bytes)} is kept in the Hugging Face cache; run the same "
            "command to resume.",
            file=sys.stderr,
        )
        return INTERRUPTED
    error = outcome.get("error")
    if error is None:
        printer.finish()
    else:
        printer.end_line()
    if isinstance(error, DownloadCancelled):
        print("Stopped.", file=sys.stderr)
        return INTERRUPTED
    if error is not None:
        raise error
    result = outcome["result"]
    _report(paths, config, result)
    return 0


def _report(paths: Paths, config: Config, result: Any) -> None:
    from lmsp_tray.daemon import build_catalog

    plan = result.plan
    if result.already_present:
        print(f"{plan.ref} is already in the Hugging Face cache; nothing to download.", file=sys.stderr)
    else:
        rate = f", {size(int(result.fetched_bytes / result.seconds))}/s" if result.seconds > 0 else ""
        print(f"Downloaded and verified {size(result.fetched_bytes)} in {result.seconds:.1f} s{rate}.", file=sys.stderr)
    model_id = None
    try:
        entries = build_catalog(paths, config).scan()
        model_id = next((e.id for e in entries if Path(e.path) == result.model_path), None)
    except Exception as exc:  # noqa: BLE001 - naming it is a courtesy; the file is there
        logging.getLogger("lmsp_tray").debug("could not scan for the pulled model: %s", exc)
    if model_id is not None:
        print(f"Model: {model_id}", file=sys.stderr)
    else:
        print(
            "This lmsp-tray is set not to scan the Hugging Face cache (default_dirs = false); add "
            f"{result.model_path.parent} to models_dirs to use the model.",
            file=sys.stderr,
        )
    print(f"File: {result.model_path}", file=sys.stderr)
    if result.projector_path is not None:
        print(f"Vision projector: {result.projector_path}", file=sys.stderr)
    if result.fit is not None:
        print(f"On this machine: {result.fit.summary}", file=sys.stderr)
    print(model_id or str(result.model_path))  # stdout: the id to use (scripts)
