"""The tray menu as a pure function of state: what the user sees and what each click asks for."""

from __future__ import annotations

import pytest

from lmsp_tray.desktop.menu import (
    ERROR,
    IDLE,
    LOADING,
    READY,
    SERVING,
    Action,
    ModelView,
    PairingView,
    ProblemFile,
    TrayState,
    activity_for,
    build_menu,
    clean_text,
    find_item,
    human_size,
    shorten,
    status_text,
    tooltip,
    walk,
    wrapped,
)

URL = "http://127.0.0.1:7373/lmsp/v1"


def models() -> tuple[ModelView, ...]:
    return (
        ModelView("gemma-3:270m-q4_k_m", 253_112_000, "Q4_K_M", "loaded"),
        ModelView("qwen3:14b-q4_k_m", 8_400_000_000, "Q4_K_M", "available"),
        ModelView("llama:tiny", 524_288, "F32", "loading", file_name="tiny.gguf"),
        ModelView("broken", 1200, None, "error", error="out of memory: needs 9 GB\nTraceback (most recent call last)"),
    )


def texts(items) -> list[str]:
    return [i.text for i in items if not i.separator]


@pytest.mark.parametrize(
    "size,expected",
    [
        (0, "0 B"),
        (999, "999 B"),
        (1000, "1.0 KB"),
        (524_288, "524 KB"),
        (253_112_000, "253 MB"),
        (8_400_000_000, "8.4 GB"),
        (9_960_000_000, "10 GB"),
        (999_600_000, "1.0 GB"),
        (70_000_000_000, "70 GB"),
        (None, ""),
    ],
)
def test_human_size(size, expected):
    assert human_size(size) == expected


def test_status_line_shows_url_and_loaded_count_and_copies_url():
    menu = build_menu(TrayState(url=URL, models=models()))
    first = menu[0]
    assert first.text == f"{URL} \u2014 1 of 4 models loaded"
    assert first.action is Action.COPY_URL and not first.default and first.enabled
    opener = find_item(menu, "Open lmsp-tray")
    assert (
        opener.action is Action.OPEN_CONSOLE and opener.default and opener.enabled
    )  # a left-click on the icon opens it


def test_open_console_needs_the_server_listening():
    opener = find_item(build_menu(TrayState(url=None)), "Open lmsp-tray")
    assert opener.action is Action.OPEN_CONSOLE and not opener.enabled


def test_status_line_before_the_server_listens():
    first = build_menu(TrayState(url=None))[0]
    assert first.text.startswith("Not serving yet") and "no models found" in first.text
    assert not first.enabled


def test_models_submenu_lists_every_model_with_size_quantization_and_state():
    menu = build_menu(TrayState(url=URL, models=models()))
    sub = find_item(menu, "Models").submenu
    assert texts(sub) == [
        "gemma-3:270m-q4_k_m \u00b7 253 MB \u00b7 Q4_K_M",
        "qwen3:14b-q4_k_m \u00b7 8.4 GB \u00b7 Q4_K_M",
        "llama:tiny \u00b7 524 KB \u00b7 F32 \u00b7 tiny.gguf \u2014 Loading\u2026",  # the file name is shown
        "broken \u00b7 1.2 KB \u2014 \u26a0 could not load",
    ]
    loaded, available, loading, broken = sub
    assert (loaded.checked, loaded.action, loaded.arg) == (True, Action.UNLOAD_MODEL, "gemma-3:270m-q4_k_m")
    assert (available.checked, available.action, available.arg) == (False, Action.LOAD_MODEL, "qwen3:14b-q4_k_m")
    assert loading.enabled is False and loading.checked is False
    # A failed load opens the whole reason, then "Try again" (which loads).
    assert texts(broken.submenu) == ["out of memory: needs 9 GB", "Try again"]  # never a traceback
    retry = broken.find("Try again")
    assert (retry.action, retry.arg) == (Action.LOAD_MODEL, "broken")
    assert find_item(menu, "Models").text == "Models (1/4 loaded)"


def test_a_long_reason_is_shown_whole_in_lines_cut_between_words():
    reason = (
        'not a GGUF model file: it starts with the bytes E2 BD CB 5F instead of "GGUF"; the file is '
        "/home/ann/.local/share/lmsp-tray/models/some-very-long-folder-name/another-one/model.gguf"
    )
    item = find_item(build_menu(TrayState(models=(ModelView("m", 10, None, "error", error=reason),))), "Models")
    lines = texts(item.submenu[0].submenu)[:-1]
    assert " ".join(lines) == reason  # nothing lost
    assert all(len(line) <= 72 or "/" in line for line in lines)
    path = "/home/ann/.local/share/lmsp-tray/models/some-very-long-folder-name/another-one/model.gguf"
    assert path in lines  # a path is never broken across lines


def test_shorten_cuts_at_word_boundaries_never_inside_a_path():
    text = "Could not open the models folder: no file manager answered; the folder is /home/ann/.local/share/x"
    cut = shorten(text, 60)
    assert cut == "Could not open the models folder: no file manager answered\u2026"
    assert shorten("short", 60) == "short"
    assert shorten("/home/ann/.local/share/lmsp-tray/models/broken-download.gguf is bad", 30) == (
        "\u2026/models/broken-download.gguf"
    )
    assert shorten("a" * 100, 10) == "a" * 9 + "\u2026"  # one word with no path: the only place to cut
    assert wrapped("one two three", 7) == ["one two", "three"]


def test_generating_model_is_marked():
    m = ModelView("a", 1, None, "loaded", generating=True)
    item = find_item(build_menu(TrayState(models=(m,))), "Models").submenu[0]
    assert item.text.endswith("\u2014 generating") and item.checked


def test_no_models_says_where_to_put_them():
    menu = build_menu(TrayState(url=URL, models_folder="~/.local/share/lmsp-tray/models"))
    sub = find_item(menu, "Models").submenu
    assert texts(sub)[0] == "No models yet" and all(not i.enabled for i in sub)
    hint = " ".join(texts(sub)[1:])
    assert "~/.local/share/lmsp-tray/models" in hint and "by themselves" in hint and "Rescan" not in hint
    assert find_item(menu, "Unload all").enabled is False


def test_unusable_files_are_listed_apart_and_not_counted():
    problems = (
        ProblemFile("slow-copy.gguf", "incomplete file, probably a download or copy ...", "~/models", True),
        ProblemFile("page.gguf", "not a GGUF model file: it looks like an HTML page", "~/models"),
    )
    state = TrayState(url=URL, models=models()[:2], problems=problems)
    menu = build_menu(state)
    assert menu[0].text.endswith("1 of 2 models loaded") and find_item(menu, "Models").text == "Models (1/2 loaded)"
    files = find_item(menu, "Files that are not usable (2)")
    assert texts(files.submenu) == ["slow-copy.gguf \u2014 incomplete", "page.gguf \u2014 not usable"]
    first = files.submenu[0]
    assert texts(first.submenu) == ["incomplete file, probably a download or copy ...", "In ~/models"]
    assert all(i.separator or not i.enabled or i.submenu is not None for i in walk(files.submenu))  # no clicks
    assert not any(i.text.startswith("Files") for i in build_menu(TrayState(url=URL)))


def test_fixed_entries_in_order():
    menu = build_menu(TrayState(url=URL, models=models(), token_available=True))
    assert texts(menu)[1:] == [
        "Open lmsp-tray",
        "Models (1/4 loaded)",
        "Unload all",
        "Rescan models",
        "Open models folder",
        "Copy access token",
        "Start at login",
        "View logs",
        "Quit",
    ]
    assert find_item(menu, "View logs").action is Action.VIEW_LOGS
    assert menu[-1].action is Action.QUIT and menu[-2].separator
    assert find_item(menu, "Unload all").action is Action.UNLOAD_ALL
    assert find_item(menu, "Rescan models").action is Action.RESCAN
    assert find_item(menu, "Open models folder").action is Action.OPEN_MODELS_FOLDER


def test_copy_token_enabled_only_with_a_token_and_never_shows_it():
    secret = "lmsp_sk_0123456789abcdef"
    off = find_item(build_menu(TrayState()), "Copy access token")
    on = find_item(build_menu(TrayState(token_available=True)), "Copy access token")
    assert (off.enabled, on.enabled) == (False, True) and on.action is Action.COPY_TOKEN
    # The state has no field for the secret; make sure nothing in the menu carries one either.
    assert all(secret not in (i.text + (i.arg or "")) for i in walk(build_menu(TrayState(token_available=True))))


@pytest.mark.parametrize("enabled,arg", [(False, "on"), (True, "off")])
def test_start_at_login_checkbox_sets_the_opposite_value(enabled, arg):
    item = find_item(build_menu(TrayState(autostart_enabled=enabled)), "Start at login")
    assert item.checked is enabled and item.action is Action.SET_AUTOSTART and item.arg == arg


def test_start_at_login_disabled_where_unsupported():
    item = find_item(build_menu(TrayState(autostart_supported=False)), "Start at login")
    assert item.enabled is False


def test_pairing_requests_show_app_scopes_code_and_approve_deny():
    p = PairingView("pair_01", "Notes \u202eevil\napp", ("models:read", "responses:create"), "WDJB-MJHT")
    menu = build_menu(TrayState(url=URL, pairings=(p,)))
    header = find_item(menu, "Pairing request")
    assert header.text == "Pairing request (1)" and not header.enabled
    entry = find_item(menu, "\u201cNotes")
    assert entry.text == "\u201cNotes evil app\u201d \u2014 code WDJB-MJHT"
    assert texts(entry.submenu) == [
        "App: Notes evil app",
        "Code: WDJB-MJHT",
        "Scopes: models:read, responses:create",
        "Approve",
        "Deny",
    ]
    assert (entry.find("Approve").action, entry.find("Approve").arg) == (Action.APPROVE_PAIRING, "pair_01")
    assert (entry.find("Deny").action, entry.find("Deny").arg) == (Action.DENY_PAIRING, "pair_01")


def test_no_pairing_section_without_requests():
    assert not any(i.text.startswith("Pairing") for i in build_menu(TrayState()))


def test_long_app_name_is_shortened():
    p = PairingView("p", "A" * 200, (), "")
    entry = find_item(build_menu(TrayState(pairings=(p,))), "\u201cA")
    assert len(entry.text) == 42 and entry.text.endswith("\u2026\u201d")


def test_notice_line_is_shown_under_the_status():
    menu = build_menu(TrayState(url=URL, notice="Could not load qwen: out of memory"))
    assert menu[1].text == "\u26a0 Could not load qwen: out of memory" and not menu[1].enabled
    assert menu[1].submenu is None


def test_a_long_notice_is_cut_between_words_and_shown_whole_one_level_down():
    notice = (
        "Keyring unavailable: no keyring backend is installed or running. Tokens still work; new secrets cannot "
        "be saved. The owner token for the CLI is kept in /run/user/1000/lmsp-tray/owner-token (only you can "
        "read it) until lmsp-tray stops."
    )
    item = build_menu(TrayState(url=URL, notice=notice))[1]
    assert item.text.endswith("\u2026") and item.text[2:-1] in notice
    cut = item.text[2:-1]
    assert notice.startswith(cut) and notice[len(cut)] in " .,;:"  # cut between words
    assert " ".join(texts(item.submenu)) == notice and "/run/user/1000/lmsp-tray/owner-token" in " ".join(
        texts(item.submenu)
    )


def test_activity():
    assert activity_for(models()) == LOADING
    assert activity_for([ModelView("a", state="loaded", generating=True)]) == SERVING
    assert activity_for([ModelView("a", state="loaded")]) == READY  # loaded and waiting: not idle
    assert activity_for([ModelView("a")]) == IDLE
    assert activity_for([ModelView("a", state="error", error="bad")]) == IDLE
    assert activity_for([ModelView("a")], failed=True) == ERROR


def test_tooltip():
    assert tooltip(TrayState(url=URL)) == f"lmsp-tray \u2014 ready \u2014 {URL}"
    assert "2 models loaded" in tooltip(TrayState(url=URL, models=(ModelView("a", state="loaded"),) * 2))
    assert "starting" in tooltip(TrayState())
    assert "\u26a0 port busy" in tooltip(TrayState(activity=ERROR, notice="port busy"))


def test_status_text_for_icons_without_a_menu():
    text = status_text(TrayState(url=URL, models=models(), notice="Keyring unavailable: locked"))
    assert text.splitlines() == [
        f"{URL} \u2014 1 of 4 models loaded",
        "\u2713 gemma-3:270m-q4_k_m",
        "\u26a0 Keyring unavailable: locked",
    ]


def test_equal_states_are_equal_and_hashable():
    a = TrayState(url=URL, models=list(models()))
    b = TrayState(url=URL, models=models())
    assert a == b and hash(a) == hash(b) and build_menu(a) == build_menu(b)
    assert a != TrayState(url=URL, models=models()[:3])


def test_clean_text():
    assert clean_text("a\x00b\r\nc\u200b d  ", 10) == "a b c d"
    assert clean_text("abcdef", 4) == "abc\u2026"
    assert clean_text("abc def ghi", 8) == "abc def\u2026"


def test_too_many_models_are_capped():
    many = tuple(ModelView(f"m{i}", 1) for i in range(130))
    sub = find_item(build_menu(TrayState(models=many)), "Models").submenu
    assert len(sub) == 101 and sub[-1].text == "30 more not shown (see GET /models)"


def test_most_urgent():
    from lmsp_tray.desktop.menu import most_urgent

    assert most_urgent(IDLE, SERVING) == SERVING
    assert most_urgent(IDLE, READY) == READY and most_urgent(READY, SERVING) == SERVING
    assert most_urgent(SERVING, LOADING, IDLE) == LOADING
    assert most_urgent(LOADING, ERROR) == ERROR
    assert most_urgent() == IDLE
