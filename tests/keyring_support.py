"""A real Secret Service for tests: gnome-keyring on a private D-Bus session bus.

`.ci/run` already runs the suite inside `dbus-run-session` with an unlocked
gnome-keyring; then `session_keyring` uses that. Run by hand without it,
`session_keyring` starts its own bus and keyring (and stops them after).
`private_keyring` always starts a fresh one (for tests that lock it).
Nothing here runs with DISPLAY set: a locked keyring must never open a dialog.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import wait_until

from lmsp_tray.auth.vault import SecretVault

PASSWORD = "lmsp-test"
SECRET_SERVICE = "keyring.backends.SecretService.Keyring"


@dataclass
class PrivateKeyring:
    address: str
    home: Path
    _bus: subprocess.Popen | None = None
    _daemon: subprocess.Popen | None = None

    def env(self) -> dict[str, str]:
        """Variables a child process needs to use this keyring."""
        return {"DBUS_SESSION_BUS_ADDRESS": self.address, "PYTHON_KEYRING_BACKEND": SECRET_SERVICE}

    def stop(self) -> None:
        for proc in (self._daemon, self._bus):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
            if proc is not None and proc.stdout is not None:
                proc.stdout.close()  # the bus's address pipe (a ResourceWarning if left to the collector)
        shutil.rmtree(self.home, ignore_errors=True)


def tools_missing() -> str | None:
    for tool in ("dbus-daemon", "gnome-keyring-daemon"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian packages dbus and gnome-keyring; .ci/run installs them)"
    return None


# A session bus that starts no services on demand: without it, the first keyring call would
# D-Bus-activate a gnome-keyring of its own (locked, no login keyring) before the test starts one.
NO_ACTIVATION = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:tmpdir=/tmp</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
"""


def start_private_keyring(*, daemon: bool = True) -> PrivateKeyring:
    """A private bus with gnome-keyring on it (`daemon=False`: a bus that activates nothing, and no
    keyring yet; `start_keyring_daemon` starts it later)."""
    home = Path(tempfile.mkdtemp(prefix="lmsp-keyring-"))
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DISPLAY", "WAYLAND_DISPLAY", "DBUS_SESSION_BUS_ADDRESS", "GNOME_KEYRING_CONTROL")
    }
    env.update(
        {
            "HOME": str(home),
            "XDG_DATA_HOME": str(home / "data"),
            "XDG_RUNTIME_DIR": str(home / "run"),
            "XDG_CACHE_HOME": str(home / "cache"),
        }
    )
    (home / "run").mkdir(mode=0o700)
    (home / "data").mkdir()
    config = ["--session"]
    if not daemon:
        (home / "bus.conf").write_text(NO_ACTIVATION)
        config = [f"--config-file={home / 'bus.conf'}"]
    bus = subprocess.Popen(
        ["dbus-daemon", *config, "--nofork", "--nopidfile", "--print-address=1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    assert bus.stdout is not None
    address = bus.stdout.readline().strip()
    if not address:
        bus.kill()
        raise RuntimeError("dbus-daemon did not print its address")
    keyring = PrivateKeyring(address, home, bus, None)
    if daemon:
        start_keyring_daemon(keyring)
    return keyring


def start_keyring_daemon(keyring: PrivateKeyring) -> None:
    """gnome-keyring-daemon on the keyring's bus, unlocked, as a desktop session starts it at login."""
    home = keyring.home
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DISPLAY", "WAYLAND_DISPLAY", "DBUS_SESSION_BUS_ADDRESS", "GNOME_KEYRING_CONTROL")
    }
    env.update(
        {
            "HOME": str(home),
            "XDG_DATA_HOME": str(home / "data"),
            "XDG_RUNTIME_DIR": str(home / "run"),
            "XDG_CACHE_HOME": str(home / "cache"),
            "DBUS_SESSION_BUS_ADDRESS": keyring.address,
        }
    )
    daemon = subprocess.Popen(
        ["gnome-keyring-daemon", "--foreground", "--unlock", "--components=secrets"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    assert daemon.stdin is not None
    daemon.stdin.write(PASSWORD)
    daemon.stdin.close()
    keyring._daemon = daemon
    if not _wait_for_secret_service(keyring.address, daemon):
        keyring.stop()
        raise RuntimeError("gnome-keyring-daemon did not come up on the private bus")


def _wait_for_secret_service(address: str, daemon: subprocess.Popen, timeout: float = 20) -> bool:
    from jeepney.bus_messages import message_bus
    from jeepney.io.blocking import open_dbus_connection

    with open_dbus_connection(bus=address) as conn:

        def owned() -> bool:
            assert daemon.poll() is None, "gnome-keyring-daemon exited"
            reply = conn.send_and_get_reply(message_bus.NameHasOwner("org.freedesktop.secrets"), timeout=5)
            return bool(reply.body[0])

        try:
            return wait_until(owned, timeout, "org.freedesktop.secrets on the private bus", interval=0.05)
        except AssertionError:
            return False


def working_session_keyring() -> bool:
    """True when this process already has a usable Secret Service (e.g. under .ci/run's dbus-run-session)."""
    if not os.environ.get("DBUS_SESSION_BUS_ADDRESS"):
        return False
    probe = (
        "import keyring.backends.SecretService as s; k = s.Keyring(); "
        "k.set_password('lmsp-tray-test', 'probe', 'x'); k.delete_password('lmsp-tray-test', 'probe')"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    try:
        return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, timeout=30).returncode == 0
    except subprocess.TimeoutExpired:
        return False


@pytest.fixture(scope="module")
def secret_service() -> Iterator[str]:
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("DISPLAY", raising=False)
        mp.delenv("WAYLAND_DISPLAY", raising=False)
        own = None
        if not working_session_keyring():
            missing = tools_missing()
            if missing:
                pytest.skip(missing)
            own = start_private_keyring()
            mp.setenv("DBUS_SESSION_BUS_ADDRESS", own.address)
        mp.setenv("PYTHON_KEYRING_BACKEND", SECRET_SERVICE)
        try:
            yield os.environ["DBUS_SESSION_BUS_ADDRESS"]
        finally:
            if own is not None:
                own.stop()


def real_vault() -> SecretVault:
    import keyring.backends.SecretService

    return SecretVault(keyring.backends.SecretService.Keyring())


def secret_tool(*args: str) -> subprocess.CompletedProcess:
    """libsecret's own CLI: an independent look into the same keyring."""
    return subprocess.run(["secret-tool", *args], capture_output=True, text=True, timeout=30)
