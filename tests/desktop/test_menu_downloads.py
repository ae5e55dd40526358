"""The tray's download lines and notifications, as pure functions of the state (the Xvfb test shows them for real)."""

from __future__ import annotations

from types import SimpleNamespace

from lmsp_tray.desktop.menu import Action, DownloadView, TrayState, build_menu, download_label, find_item
from lmsp_tray.desktop.service_notices import download_notification
from lmsp_tray.serving.downloads import DownloadStatus

URL = "http://127.0.0.1:7373/lmsp/v1"


def texts(items) -> list[str]:
    return [i.text for i in items if not i.separator]


def test_a_download_line_shows_share_speed_and_time_left() -> None:
    running = DownloadView("task_1", "hf.co/org/repo:Q4_K_M", 2_100_000_000, 4_700_000_000, 35_200_000.0, 74)
    assert download_label(running) == "hf.co/org/repo:Q4_K_M \u2014 44% \u00b7 35 MB/s \u00b7 1 min left"
    slow = DownloadView("task_2", "org/repo/m.gguf", 10, 1000, None, None)
    assert download_label(slow) == "org/repo/m.gguf \u2014 1%"
    long = DownloadView("task_3", "org/repo:Q8_0", 0, 10**10, 1e6, 3 * 3600 + 120)
    assert download_label(long).endswith("3 h 02 min left")
    queued = DownloadView("task_4", "org/repo:Q8_0", queued=True)
    assert download_label(queued) == "org/repo:Q8_0 \u2014 queued"
    odd = DownloadView("task_5", "org/\u202erepo\n:Q8_0", 1, 2)
    assert "\u202e" not in download_label(odd) and "\n" not in download_label(odd)


def test_the_downloading_section_appears_only_while_something_downloads() -> None:
    idle = texts(build_menu(TrayState(url=URL)))
    assert not any(t.startswith("Downloading") for t in idle)
    state = TrayState(
        url=URL,
        downloads=[DownloadView("task_1", "hf.co/a/b:Q4_K_M", 1, 4), DownloadView("task_2", "c/d", queued=True)],
    )
    menu = build_menu(state)
    shown = texts(menu)
    start = shown.index("Downloading (2)")
    assert shown[start - 1] == "Open models folder"
    assert shown[start + 1 : start + 3] == ["hf.co/a/b:Q4_K_M \u2014 25%", "c/d \u2014 queued"]
    assert find_item(menu, "Downloading").action is None and not find_item(menu, "Downloading").enabled
    cancel = find_item(menu, "hf.co/a/b").find("Cancel download")  # each download has its Cancel
    assert cancel.action is Action.CANCEL_DOWNLOAD and cancel.arg == "task_1"
    assert find_item(menu, "c/d").find("Cancel download").arg == "task_2"
    assert state == TrayState(url=URL, downloads=list(state.downloads)) and hash(state)


def test_notifications_say_ready_or_why_it_failed_and_nothing_while_running() -> None:
    done = DownloadStatus("task_1", "hf.co/org/repo:Q4_K_M", "completed", model_id="repo:7b-q4_k_m")
    assert download_notification(done) == "Downloaded hf.co/org/repo:Q4_K_M: ready as repo:7b-q4_k_m."
    elsewhere = DownloadStatus("task_1", "hf.co/org/repo:Q4_K_M", "completed")
    assert download_notification(elsewhere) == "Downloaded hf.co/org/repo:Q4_K_M into the Hugging Face cache."
    failed = DownloadStatus("task_2", "org/repo:Q8_0", "failed", error="Not enough disk space: …\nsecond line")
    assert download_notification(failed) == "Download of org/repo:Q8_0 failed: Not enough disk space: …"
    for state in ("queued", "running", "cancelled"):
        assert download_notification(SimpleNamespace(ref="x/y", state=state)) is None
