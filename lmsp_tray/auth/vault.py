"""Token secrets in the OS keyring, behind one small class with one typed failure.

Why: the `keyring` package fails in many shapes — `NoKeyringError` (no
backend at all), `KeyringLocked` (the user's collection is locked), a plain
`RuntimeError` (Secret Service forced but no D-Bus session), D-Bus errors
from secretstorage/jeepney, or simply never answering while an unlock
prompt waits for a person. `SecretVault` turns every one of them into
`KeyringUnavailable`, whose message says what is wrong and what to do, so
the CLI and the tray can show one clear line instead of a traceback.

Each token's secret is one keyring entry: service ``lmsp-tray``, username
the token id (``tok_…``); in the Secret Service (GNOME Keyring, KWallet's
Secret Service) the entry is labelled with the token's name ("lmsp-tray
token: my-app"), which is what Seahorse and similar keyring managers show.
Backends that would not keep a secret safely are refused rather than used:
the `fail` and `null` backends (nothing kept) and plaintext file backends from
``keyrings.alt``.

`OwnerTokenFile` is the one exception, for the one secret the service itself
must hand to the CLI while no keyring works: the owner token of the current
run, in a file in the per-user runtime folder (on Linux `$XDG_RUNTIME_DIR`, a
tmpfs gone at logout) that only this user can read (folder 0700, file 0600,
checked on read). What happens without a keyring is described in
`lmsp_tray.auth.tokens`.

Keyring calls block (0.1–0.3 s over D-Bus); they are never made on the
request path — bearer tokens are checked against hashes in memory.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from lmsp_tray.private import write_private

SERVICE_NAME = "lmsp-tray"
DEFAULT_TIMEOUT_S = 15.0

T = TypeVar("T")

# Backends that do not keep a secret, or keep it in plain text.
_UNSAFE_BACKENDS = (
    "keyring.backends.fail.",
    "keyring.backends.null.",
    "keyrings.alt.file.PlaintextKeyring",
)

HOW_TO_FIX = (
    "Start your desktop's keyring (GNOME Keyring/KWallet on Linux, the login Keychain on macOS, "
    "Credential Manager on Windows) and unlock it; lmsp-tray notices by itself. Meanwhile it keeps "
    "working: it checks tokens as before, `lmsp-tray tokens create` still makes tokens (the secret is "
    "printed once, keep it), and the CLI finds the running service's owner token in a file only you can read."
)


class KeyringUnavailable(Exception):
    """The OS keyring cannot be used right now; `str()` is a message for a person."""

    def __init__(self, reason: str, *, kind: str = "error") -> None:
        super().__init__(f"the OS keyring is unavailable: {reason}. {HOW_TO_FIX}")
        self.reason = reason
        self.kind = kind  # "no_backend" | "locked" | "no_dbus" | "unsafe_backend" | "timeout" | "error"


def describe_failure(exc: BaseException) -> KeyringUnavailable:
    """The `KeyringUnavailable` for any exception the keyring stack raised."""
    if isinstance(exc, KeyringUnavailable):
        return exc
    import keyring.errors

    name = type(exc).__name__
    text = str(exc)
    if isinstance(exc, keyring.errors.NoKeyringError):
        return KeyringUnavailable("no keyring backend is installed or running", kind="no_backend")
    if isinstance(exc, keyring.errors.KeyringLocked):
        return KeyringUnavailable(
            "the keyring is locked and could not be unlocked (no unlock prompt could be shown)", kind="locked"
        )
    lowered = text.lower()
    if "dbus" in lowered or "d-bus" in lowered or "secretservice" in lowered or "secret service" in lowered:
        return KeyringUnavailable(
            "the Secret Service cannot be reached over D-Bus (no session bus, or no keyring daemon on it)",
            kind="no_dbus",
        )
    if isinstance(exc, keyring.errors.KeyringError):
        return KeyringUnavailable(f"the keyring refused the request ({name})")
    return KeyringUnavailable(f"the keyring failed ({name})")


def _is_secret_service(backend: Any) -> bool:
    return type(backend).__module__ == "keyring.backends.SecretService" and hasattr(backend, "get_preferred_collection")


def _store_labelled(backend: Any, service: str, username: str, secret: str, label: str) -> None:
    """What keyring's SecretService backend does in `set_password`, with our label instead of its
    "Password for 'tok_…' on 'lmsp-tray'"; the attributes are the same, so reads and deletes match."""
    from contextlib import closing

    collection = backend.get_preferred_collection()
    query = getattr(backend, "_query", None)
    if callable(query):
        attributes = query(service, username, application=backend.appid)
    else:  # pragma: no cover - older keyring releases
        attributes = {"application": backend.appid, "service": service, "username": username}
    with closing(collection.connection):
        collection.create_item(label, attributes, secret, replace=True)


def token_label(name: str) -> str:
    """The keyring entry's label for a token named `name`."""
    return f"{SERVICE_NAME} token: {name}"


class SecretVault:
    """Keeps token secrets in the OS keyring (service ``lmsp-tray``, one entry per token id)."""

    def __init__(
        self, backend: Any | None = None, *, service: str = SERVICE_NAME, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        self._backend = backend
        self.service = service
        self.timeout_s = timeout_s

    # -- public API -------------------------------------------------------------------------------
    def backend_name(self) -> str:
        """The backend in use, e.g. ``SecretService Keyring`` (raises `KeyringUnavailable`)."""
        backend = self._call(self._resolve)
        return getattr(backend, "name", type(backend).__name__)

    def check(self) -> None:
        """Raise `KeyringUnavailable` unless a safe backend answers a read."""
        self._call(lambda: self._resolve().get_password(self.service, "lmsp-tray-probe"))

    def store(self, token_id: str, secret: str, label: str | None = None) -> None:
        """Keep `secret` under `token_id`; `label` names the entry where the keyring shows names."""

        def write() -> None:
            backend = self._resolve()
            if label and _is_secret_service(backend):
                _store_labelled(backend, self.service, token_id, secret, label)
            else:
                backend.set_password(self.service, token_id, secret)

        self._call(write)

    def load(self, token_id: str) -> str | None:
        return self._call(lambda: self._resolve().get_password(self.service, token_id))

    def delete(self, token_id: str) -> bool:
        """Remove the entry; False when there was none."""
        import keyring.errors

        def remove() -> bool:
            try:
                self._resolve().delete_password(self.service, token_id)
            except keyring.errors.PasswordDeleteError:
                return False
            return True

        return self._call(remove)

    # -- internals -------------------------------------------------------------------------------
    def _resolve(self) -> Any:
        import keyring

        backend = self._backend if self._backend is not None else keyring.get_keyring()
        qualified = f"{type(backend).__module__}.{type(backend).__qualname__}"
        if any(qualified.startswith(prefix) for prefix in _UNSAFE_BACKENDS):
            if qualified.startswith("keyring.backends.fail."):
                raise KeyringUnavailable("no keyring backend is installed or running", kind="no_backend")
            raise KeyringUnavailable(
                f"the configured keyring backend ({qualified}) would not keep secrets "
                f"safely, so lmsp-tray does not use it",
                kind="unsafe_backend",
            )
        inner = getattr(backend, "backends", None)  # keyring's ChainerBackend
        if isinstance(inner, (list, tuple)) and not inner:
            raise KeyringUnavailable("no keyring backend is installed or running", kind="no_backend")
        return backend

    def _call(self, fn: Callable[[], T]) -> T:
        """Run one keyring call on a helper thread, so a waiting unlock prompt cannot hang us."""
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:  # noqa: BLE001 — everything becomes KeyringUnavailable
                box["error"] = exc

        worker = threading.Thread(target=run, name="lmsp-keyring", daemon=True)
        worker.start()
        worker.join(self.timeout_s)
        if worker.is_alive():
            raise KeyringUnavailable(
                f"the keyring did not answer within {self.timeout_s:.0f} s (is an unlock prompt waiting?)",
                kind="timeout",
            )
        if "error" in box:
            raise describe_failure(box["error"]) from None
        return box["value"]


class TokenFileError(Exception):
    """The owner token file is missing, or not private to this user; `str()` says which."""


class OwnerTokenFile:
    """The owner token of this run, for the CLI, while no keyring can keep it (see the module doc).

    Like Jupyter's `jpserver-<pid>.json` (its token, in a 0600 file in the user's runtime folder),
    and unlike a plain dotfile: it lives in the runtime folder, holds a secret valid only while this
    run lasts, and is removed when the service stops or the keyring works again.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, secret: str) -> None:
        folder = self.path.parent
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        if sys.platform != "win32":
            info = os.stat(folder)
            if info.st_uid != os.getuid():
                raise TokenFileError(f"{folder} belongs to another user")
            if stat.S_IMODE(info.st_mode) & 0o077:
                os.chmod(folder, 0o700)
        write_private(self.path, secret + "\n")

    def read(self) -> str:
        """The secret; raises `TokenFileError` when there is none or it is not private to this user."""
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            raise TokenFileError(f"there is no owner token file at {self.path}") from None
        except OSError as exc:
            raise TokenFileError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        with os.fdopen(fd, "r", encoding="utf-8") as fh:
            if sys.platform != "win32":
                info = os.fstat(fh.fileno())
                if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
                    raise TokenFileError(f"{self.path} is readable by others or not yours; not using it")
            return fh.read().strip()

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
