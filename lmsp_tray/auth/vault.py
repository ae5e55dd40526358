"""Token secrets in the OS keyring, behind one small class with one typed failure.

Why: the `keyring` package fails in many shapes — `NoKeyringError` (no
backend at all), `KeyringLocked` (the user's collection is locked), a plain
`RuntimeError` (Secret Service forced but no D-Bus session), D-Bus errors
from secretstorage/jeepney, or simply never answering while an unlock
prompt waits for a person. `SecretVault` turns every one of them into
`KeyringUnavailable`, whose message says what is wrong and what to do, so
the CLI and the tray can show one clear line instead of a traceback.

Each token's secret is one keyring entry: service ``lmsp-tray``, username
the token id (``tok_…``). Backends that would not keep a secret safely are
refused rather than used: the `fail` and `null` backends (nothing kept) and
plaintext file backends from ``keyrings.alt``. lmsp-tray never writes a
secret to a file of its own; what happens without a keyring is described in
`lmsp_tray.auth.tokens`.

Keyring calls block (0.1–0.3 s over D-Bus); they are never made on the
request path — bearer tokens are checked against hashes in memory.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

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
    "Credential Manager on Windows) and unlock it, then try again. Without a keyring lmsp-tray keeps "
    "working: it still checks tokens, but cannot remember new secrets — set LMSP_TRAY_TOKEN to a token "
    "for the CLI, or stop the service and run `lmsp-tray tokens …` to act on the data folder directly."
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

    def store(self, token_id: str, secret: str) -> None:
        self._call(lambda: self._resolve().set_password(self.service, token_id, secret))

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
