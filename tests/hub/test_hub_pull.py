"""Pulls against a local fake Hub (`hub_server`), into a temporary Hugging Face cache, read back by discovery.

Every test here talks HTTP over real sockets through huggingface_hub to a server
serving generated GGUF repositories; nothing reaches the internet. The server
counts the body bytes it sends per file, so resume tests prove that no byte
was fetched twice, and it can cut a body mid-way, flip a byte, pause at an
offset, ignore ranges, or refuse a gated repository.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
from hub_server import FakeHub
from hub_support import GATED, GRANTED, NOQ4, NOT_GRANTED, TINY, fake_hub, hf_env, hub  # noqa: F401
from support import wait_until

from lmsp_tray.discovery.catalog import Catalog
from lmsp_tray.discovery.sources import HUGGINGFACE, Source
from lmsp_tray.errors import InsufficientStorage
from lmsp_tray.hub.errors import (
    DownloadCancelled,
    GatedRepository,
    HubFileNotFound,
    RepositoryNotFound,
    VerificationFailed,
)
from lmsp_tray.hub.fit import FITS_IN_RAM, FULL_GPU, PARTIAL_GPU, TOO_LARGE, Machine
from lmsp_tray.hub.pull import Puller, PullPlan, PullProgress
from lmsp_tray.hub.remote import HubClient
from lmsp_tray.hub.remote_header import BLOCK
from lmsp_tray.hub.space import HEADROOM_BYTES
from lmsp_tray.hub.transfer import CancelToken

pytestmark = pytest.mark.timeout(120)

PLENTY = Machine(ram_budget=64 << 30, cores=2)


def puller(cache: Path, hub: FakeHub, *, token: str | bool | None = None, **kw) -> Puller:
    return Puller(cache, client=HubClient(hub.endpoint, token=token), machine=lambda: PLENTY, **kw)


def listed(cache: Path) -> list:
    """What discovery offers from this HF cache (a fresh catalog, as another process would see it)."""
    return Catalog([Source(HUGGINGFACE, cache, "huggingface")]).scan()


def pull(p: Puller, text: str, **kw) -> tuple:
    events: list[PullProgress] = []
    plan = p.plan(text, **kw)
    return plan, p.run(plan, events.append, CancelToken()), events


def key(path: str, repo: str = TINY) -> str:
    return f"{repo}/{path}"


def size_of(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def test_default_pull_fetches_q4_k_m_and_its_projector_into_the_cache(hf_env: Path, hub: FakeHub) -> None:
    plan, result, events = pull(puller(hf_env, hub), f"hf.co/{TINY}")
    assert plan.quant == "Q4_K_M" and "default" in plan.reason
    assert [f.spec.path for f in plan.files] == ["Tiny-Q4_K_M.gguf", "mmproj-F16.gguf"]
    repo = hub.repos[TINY]
    snapshot = hf_env / "models--test-org--Tiny-GGUF" / "snapshots" / repo.commit
    assert result.model_path == snapshot / "Tiny-Q4_K_M.gguf"
    assert result.projector_path == snapshot / "mmproj-F16.gguf"
    # The layout huggingface_hub uses: relative links into blobs named by SHA-256, and refs/main.
    for path in ("Tiny-Q4_K_M.gguf", "mmproj-F16.gguf"):
        link = snapshot / path
        assert link.is_symlink() and link.resolve() == hf_env / "models--test-org--Tiny-GGUF" / "blobs" / repo.sha256(
            path
        )
        assert link.read_bytes() == repo.files[path]
        assert hub.downloaded[key(path)] == len(repo.files[path])  # each byte once
    assert (hf_env / "models--test-org--Tiny-GGUF" / "refs" / "main").read_text() == repo.commit
    assert not list(hf_env.rglob("*.incomplete"))
    # Discovery finds the model (the projector is not a model), and huggingface_hub sees it as cached.
    assert [e.id for e in listed(hf_env)] == ["tiny-hub:1m-q4_k_m"]
    from huggingface_hub import try_to_load_from_cache

    assert try_to_load_from_cache(TINY, "Tiny-Q4_K_M.gguf", cache_dir=hf_env) == str(result.model_path)
    # Progress: bytes never go back, end at the total, and speed/ETA appear while downloading.
    done = [e.bytes_done for e in events]
    assert done == sorted(done) and done[-1] == plan.total_bytes == result.fetched_bytes
    assert all(e.bytes_total == plan.total_bytes for e in events)
    assert {e.phase for e in events} >= {"downloading", "verifying"}
    assert result.fit is not None and result.fit.verdict == FITS_IN_RAM and result.fit.estimated_from == "header"
    assert plan.fit is not None and plan.fit.total_layers == result.fit.total_layers == 3


def test_every_ref_form_pulls_the_same_files(hf_env: Path, hub: FakeHub) -> None:
    p = puller(hf_env, hub)
    forms = {
        f"hf.co/{TINY}:q5_k_m": "Tiny-Q5_K_M.gguf",
        f"{TINY}:Q5_K_M": "Tiny-Q5_K_M.gguf",
        f"{TINY}/Tiny-Q5_K_M.gguf": "Tiny-Q5_K_M.gguf",
        f"{hub.endpoint}/{TINY}/resolve/main/Tiny-Q5_K_M.gguf": "Tiny-Q5_K_M.gguf",
        f"https://huggingface.co/{TINY}/blob/main/Tiny-Q4_K_M.gguf": "Tiny-Q4_K_M.gguf",
    }
    for text, path in forms.items():
        plan, result, _ = pull(p, text, projector=False)
        assert [f.spec.path for f in plan.files] == [path], text
        assert result.model_path.name == path
    # Pulled once each: later forms found them in the cache.
    assert hub.downloaded[key("Tiny-Q5_K_M.gguf")] == len(hub.repos[TINY].files["Tiny-Q5_K_M.gguf"])
    assert sorted(e.id for e in listed(hf_env)) == ["tiny-hub:1m-q4_k_m", "tiny-hub:1m-q5_k_m"]


def test_without_q4_k_m_the_fallback_is_chosen_and_said(hf_env: Path, hub: FakeHub) -> None:
    plan, result, _ = pull(puller(hf_env, hub), NOQ4)
    assert plan.quant == "Q5_K_M" and "no Q4_K_M" in plan.reason
    assert result.model_path.name == "NoQ4-Q5_K_M.gguf" and result.projector_path is None


def test_a_split_model_is_fetched_whole_and_listed_once(hf_env: Path, hub: FakeHub) -> None:
    plan, result, events = pull(puller(hf_env, hub), f"{TINY}:Q8_0", projector=False)
    parts = [f"Q8_0/Tiny-Q8_0-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert [f.spec.path for f in plan.files] == parts
    assert [p.name for p in result.paths] == [Path(p).name for p in parts]
    for part in parts:
        assert hub.downloaded[key(part)] == len(hub.repos[TINY].files[part])
    assert {e.files_total for e in events} == {3} and events[-1].files_done == 2
    entries = listed(hf_env)
    assert [(e.id, e.error, len(e.files)) for e in entries] == [("tiny-hub:1m-q8_0", None, 3)]
    assert entries[0].size_bytes == plan.total_bytes


def test_a_cut_connection_resumes_at_once_without_fetching_a_byte_twice(hf_env: Path, hub: FakeHub) -> None:
    path = "Tiny-Q5_K_M.gguf"
    size = len(hub.repos[TINY].files[path])
    hub.cut_at[key(path)] = [100_000, 400_000]
    _, result, _ = pull(puller(hf_env, hub), f"{TINY}/{path}")
    assert result.model_path.read_bytes() == hub.repos[TINY].files[path]
    assert hub.downloaded[key(path)] == size
    ranges = [entry for server, _, entry in hub.log if server == "cdn" and "bytes=" in entry and entry.endswith("-")]
    assert len(ranges) == 2 and ranges[0].endswith("bytes=100000-") and ranges[1].endswith("bytes=400000-")


def test_a_cancelled_pull_keeps_its_part_hidden_from_discovery_and_the_next_pull_resumes(
    hf_env: Path, hub: FakeHub
) -> None:
    path = "Tiny-Q5_K_M.gguf"
    data = hub.repos[TINY].files[path]
    pause = hub.pause(key(path), 300_000)
    p = puller(hf_env, hub)
    plan = p.plan(f"{TINY}:Q5_K_M", projector=False)
    cancel = CancelToken()
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            p.run(plan, lambda _: None, cancel)
        except BaseException as exc:  # noqa: BLE001
            outcome.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    assert pause.reached.wait(30)
    # Half downloaded: only blobs/<sha256>.incomplete exists, and discovery lists nothing.
    partial = hf_env / "models--test-org--Tiny-GGUF" / "blobs" / f"{hub.repos[TINY].sha256(path)}.incomplete"
    wait_until(lambda: size_of(partial) == 300_000, 30, "the part to reach 300,000 bytes")
    assert not (hf_env / "models--test-org--Tiny-GGUF" / "snapshots").exists()
    assert listed(hf_env) == []
    cancel.cancel("interrupted")
    worker.join(30)
    assert isinstance(outcome[0], DownloadCancelled)
    assert partial.stat().st_size == 300_000 and listed(hf_env) == []
    assert hub.wait_idle()  # the cancel broke the connection: the server saw it go
    # The next pull asks only for the rest.
    pause.release.set()
    hub.downloaded.clear()
    replan = p.plan(f"{TINY}:Q5_K_M", projector=False)
    assert replan.files[0].partial == 300_000 and replan.to_fetch == len(data) - 300_000
    events: list[PullProgress] = []
    result = p.run(replan, events.append, CancelToken())
    assert hub.downloaded[key(path)] == len(data) - 300_000
    assert result.model_path.read_bytes() == data and result.fetched_bytes == len(data) - 300_000
    assert events[0].phase == "checking"  # the kept part is hashed again before going on
    assert [e.id for e in listed(hf_env)] == ["tiny-hub:1m-q5_k_m"]


def test_a_corrupted_byte_fails_verification_and_nothing_is_offered(hf_env: Path, hub: FakeHub) -> None:
    path = "Tiny-Q4_K_M.gguf"
    hub.flip[key(path)] = 123_456
    p = puller(hf_env, hub)
    with pytest.raises(VerificationFailed, match="arrived damaged.*SHA-256.*deleted") as caught:
        pull(p, f"{TINY}/{path}")
    assert caught.value.code == "verification_failed" and caught.value.extra["file"] == path
    assert not list(hf_env.rglob("*.incomplete")) and not list(hf_env.rglob("blobs/*"))
    assert not (hf_env / "models--test-org--Tiny-GGUF" / "snapshots").exists()
    assert listed(hf_env) == []
    # Once the server sends the right bytes, the same pull works.
    del hub.flip[key(path)]
    _, result, _ = pull(p, f"{TINY}/{path}")
    assert result.model_path.read_bytes() == hub.repos[TINY].files[path]


def test_a_server_ignoring_ranges_restarts_the_file_and_still_verifies(hf_env: Path, hub: FakeHub) -> None:
    path = "Tiny-Q4_K_M.gguf"
    size = len(hub.repos[TINY].files[path])
    hub.cut_at[key(path)] = [200_000]
    hub.ignore_range.add(key(path))
    _, result, _ = pull(puller(hf_env, hub), f"{TINY}/{path}")
    assert result.model_path.read_bytes() == hub.repos[TINY].files[path]
    assert hub.downloaded[key(path)] == 200_000 + size


def test_a_small_disk_refuses_before_the_first_byte(hf_env: Path, hub: FakeHub) -> None:
    """The free-space seam: `Puller(free_space=...)` is how the disk's free bytes are asked for.

    A tmpfs with a quota would need root; instead the test gives the puller a disk
    with 1 MB free. The check must refuse before any byte is fetched, with the
    required and available bytes in the error (what the API's 507 and the CLI print).
    """
    asked: list[Path] = []

    def one_megabyte(folder: Path) -> int:
        asked.append(folder)
        return 1_000_000

    p = puller(hf_env, hub, free_space=one_megabyte)
    plan = p.plan(f"{TINY}:Q8_0")
    with pytest.raises(InsufficientStorage) as caught:
        p.check_space(plan)
    err = caught.value
    assert err.status == 507 and err.code == "insufficient_storage"
    assert err.extra["required_bytes"] == plan.total_bytes + HEADROOM_BYTES
    assert err.extra["available_bytes"] == 1_000_000 and asked == [hf_env]
    assert "needs" in err.detail and "1.0 MB free" in err.detail
    with pytest.raises(InsufficientStorage):
        p.run(plan, lambda _: None, CancelToken())  # run checks again before each file
    assert sum(hub.downloaded.values()) == 0


def test_the_real_disk_check_refuses_a_file_bigger_than_the_disk(hf_env: Path, hub: FakeHub) -> None:
    """The same check on this machine's real disk, with the size faked at the plan instead (a 1 PB file)."""
    p = puller(hf_env, hub)
    plan = p.plan(f"{TINY}:Q4_K_M", projector=False)
    huge = PullPlan.from_json({**plan.to_json(), "files": [{**plan.to_json()["files"][0], "size": 10**15}]})
    with pytest.raises(InsufficientStorage, match="Not enough disk space") as caught:
        p.check_space(huge)
    assert caught.value.extra["required_bytes"] == 10**15 + HEADROOM_BYTES
    assert 0 < caught.value.extra["available_bytes"] < 10**15


@pytest.mark.parametrize(("token", "status", "message"), [(False, 401, "log in here"), (NOT_GRANTED, 403, "no access")])
def test_a_gated_repository_says_where_to_accept_the_licence(
    hf_env: Path, hub: FakeHub, token: str | bool, status: int, message: str
) -> None:
    with pytest.raises(GatedRepository, match=message) as caught:
        puller(hf_env, hub, token=token).plan(GATED)
    err = caught.value
    assert err.status == 403 and err.code == "gated_repository"
    assert err.extra["license_url"] == f"{hub.endpoint}/{GATED}" and err.extra["license_url"] in err.detail
    assert sum(hub.downloaded.values()) == 0


def test_the_users_token_opens_a_gated_repository_and_never_leaves_the_hub(
    hf_env: Path, hub: FakeHub, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("HF_TOKEN", GRANTED)  # where huggingface_hub finds the user's token
    caplog.set_level(logging.DEBUG)
    _, result, _ = pull(puller(hf_env, hub), GATED)
    assert result.model_path.read_bytes() == hub.repos[GATED].files["Gated-Q4_K_M.gguf"]
    assert f"Bearer {GRANTED}" in hub.hub_auth  # sent to the Hub...
    assert hub.cdn_auth == []  # ...never to the CDN that serves the bytes
    assert GRANTED not in caplog.text


def test_unknown_repositories_and_files_say_so(hf_env: Path, hub: FakeHub) -> None:
    p = puller(hf_env, hub)
    with pytest.raises(RepositoryNotFound, match="no model repository test-org/Nope"):
        p.plan("test-org/Nope")
    with pytest.raises(HubFileNotFound, match=r"Available: Q4_K_M, Q5_K_M, Q8_0\."):
        p.plan(f"{TINY}:IQ1_S")
    with pytest.raises(HubFileNotFound, match="no file nope.gguf"):
        p.plan(f"{TINY}/nope.gguf")


def test_two_pulls_of_one_file_share_one_download(hf_env: Path, hub: FakeHub) -> None:
    path = "Tiny-Q5_K_M.gguf"
    pause = hub.pause(key(path), 200_000)
    p = puller(hf_env, hub)
    plans = [p.plan(f"{TINY}:Q5_K_M", projector=False), p.plan(f"hf.co/{TINY}:q5_k_m", projector=False)]
    seen: list[list[PullProgress]] = [[], []]
    results: list = [None, None]

    def run(i: int) -> None:
        try:
            results[i] = p.run(plans[i], seen[i].append, CancelToken())
        except BaseException as exc:  # noqa: BLE001
            results[i] = exc

    first = threading.Thread(target=run, args=(0,))
    first.start()
    assert pause.reached.wait(30)
    second = threading.Thread(target=run, args=(1,))
    second.start()
    wait_until(
        lambda: seen[1], 30, "the second pull's progress"
    )  # the second follows the first's transfer (it gets its progress)
    assert p.transfers.active() == 1
    pause.release.set()
    first.join(30)
    second.join(30)
    assert results[0].model_path == results[1].model_path
    assert hub.downloaded[key(path)] == len(hub.repos[TINY].files[path])
    assert seen[1][-1].bytes_done == seen[1][-1].bytes_total
    # The second followed the transfer itself (its bytes and speed), not merely waited on the cache lock.
    assert {e.phase for e in seen[1]} == {"downloading", "verifying"}


def test_one_of_two_pulls_cancelling_does_not_stop_the_other(hf_env: Path, hub: FakeHub) -> None:
    path = "Tiny-Q5_K_M.gguf"
    pause = hub.pause(key(path), 200_000)
    p = puller(hf_env, hub)
    plan = p.plan(f"{TINY}:Q5_K_M", projector=False)
    tokens = [CancelToken(), CancelToken()]
    outcome: list = [None, None]

    def run(i: int) -> None:
        try:
            outcome[i] = p.run(plan, lambda _: None, tokens[i])
        except BaseException as exc:  # noqa: BLE001
            outcome[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    threads[0].start()
    assert pause.reached.wait(30)
    threads[1].start()
    while p.transfers.active() != 1 or not threads[1].is_alive():
        threads[1].join(0.05)
    tokens[0].cancel()
    threads[0].join(30)
    assert isinstance(outcome[0], DownloadCancelled)
    assert not hub.wait_idle(0.5)  # the other pull still wants the file: its connection stays
    pause.release.set()
    threads[1].join(30)
    assert outcome[1].model_path.read_bytes() == hub.repos[TINY].files[path]
    assert hub.downloaded[key(path)] == len(hub.repos[TINY].files[path])


def test_a_second_pull_of_a_present_model_fetches_nothing(hf_env: Path, hub: FakeHub) -> None:
    p = puller(hf_env, hub)
    pull(p, f"{TINY}:Q4_K_M")
    hub.downloaded.clear()
    plan, result, _ = pull(p, f"{TINY}:Q4_K_M")
    assert plan.complete and plan.to_fetch == 0 and result.already_present and result.fetched_bytes == 0
    assert sum(hub.downloaded.values()) == 0


@pytest.mark.parametrize(
    ("machine", "verdict", "words"),
    [
        (Machine(ram_budget=1 << 40, vram_budget=1 << 40, gpu_free=1 << 40), FULL_GPU, "full GPU offload possible"),
        (
            Machine(
                ram_budget=1 << 40, vram_budget=1 << 40, gpu_free=(576 << 20) + 700_000
            ),  # the margin, compute buffers, a layer
            PARTIAL_GPU,
            "partial GPU offload",
        ),
        (Machine(ram_budget=1 << 40), FITS_IN_RAM, "fits in RAM"),
        (Machine(ram_budget=10_000_000), TOO_LARGE, "too large for this machine"),
    ],
)
def test_memory_fit_before_and_after_download_comes_from_the_load_planner(
    hf_env: Path, hub: FakeHub, machine: Machine, verdict: str, words: str
) -> None:
    p = Puller(hf_env, client=HubClient(hub.endpoint), machine=lambda: machine)
    plan, result, _ = pull(p, f"{TINY}:Q8_0", projector=False)
    for fit in (plan.fit, result.fit):
        assert fit is not None and fit.verdict == verdict and words in fit.summary, fit
        assert fit.estimated_from == "header"
    # Bytes read from the Hub to learn the header before downloading: a little, not the model.
    header_bytes = sum(hub.served.values()) - sum(hub.downloaded.values())
    assert 0 < header_bytes <= 2 * BLOCK
