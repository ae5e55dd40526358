"""Model names on Hugging Face (every form other tools use) and the choice of a variant among a repository's files."""

from __future__ import annotations

import pytest

from lmsp_tray.errors import InvalidRequest
from lmsp_tray.hub.errors import HubFileNotFound
from lmsp_tray.hub.refs import HubRef, parse_ref
from lmsp_tray.hub.variants import RemoteFile, choose, projector_for, variants


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("hf.co/bartowski/Qwen3-8B-GGUF", HubRef("bartowski/Qwen3-8B-GGUF")),
        ("hf.co/bartowski/Qwen3-8B-GGUF:Q4_K_M", HubRef("bartowski/Qwen3-8B-GGUF", quant="Q4_K_M")),
        ("hf.co/bartowski/Qwen3-8B-GGUF:q5_k_m", HubRef("bartowski/Qwen3-8B-GGUF", quant="Q5_K_M")),
        ("hf.co/bartowski/Qwen3-8B-GGUF:latest", HubRef("bartowski/Qwen3-8B-GGUF")),
        ("huggingface.co/unsloth/gemma-3-1b-it-GGUF:IQ4_XS", HubRef("unsloth/gemma-3-1b-it-GGUF", quant="IQ4_XS")),
        ("  unsloth/gemma-3-1b-it-GGUF  ", HubRef("unsloth/gemma-3-1b-it-GGUF")),
        ("unsloth/gemma-3-1b-it-GGUF:Q8_0", HubRef("unsloth/gemma-3-1b-it-GGUF", quant="Q8_0")),
        (
            "unsloth/gemma-3-1b-it-GGUF/gemma-3-1b-it-Q4_K_M.gguf",
            HubRef("unsloth/gemma-3-1b-it-GGUF", filename="gemma-3-1b-it-Q4_K_M.gguf"),
        ),
        (
            "org/big-GGUF/Q8_0/big-Q8_0-00001-of-00002.gguf",
            HubRef("org/big-GGUF", filename="Q8_0/big-Q8_0-00001-of-00002.gguf"),
        ),
        (
            "https://huggingface.co/org/repo/resolve/main/model-Q4_K_M.gguf?download=true",
            HubRef("org/repo", filename="model-Q4_K_M.gguf"),
        ),
        (
            "https://huggingface.co/org/repo/blob/0123456789abcdef0123456789abcdef01234567/sub/m.gguf",
            HubRef("org/repo", filename="sub/m.gguf", revision="0123456789abcdef0123456789abcdef01234567"),
        ),
        ("https://hf.co/org/repo", HubRef("org/repo")),
        ("https://huggingface.co/org/repo/tree/v1.0", HubRef("org/repo", revision="v1.0")),
    ],
)
def test_every_ref_form(text: str, expected: HubRef) -> None:
    assert parse_ref(text) == expected


def test_a_mirror_url_is_accepted_only_when_it_is_the_endpoint() -> None:
    url = "http://127.0.0.1:9999/org/repo/resolve/main/m.gguf"
    assert parse_ref(url, endpoint="http://127.0.0.1:9999") == HubRef("org/repo", filename="m.gguf")
    with pytest.raises(InvalidRequest, match="not a Hugging Face URL"):
        parse_ref(url)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "Name a model"),
        ("llama3.2", "not a Hugging Face model name"),
        ("org/repo/README.md", "not a .gguf model"),
        ("org/re po", "not a valid organization or repository name"),
        ("org/repo--x", "not a valid"),
        ("org/repo:Q4 K", "not a quantization tag"),
        ("org/repo/../x.gguf", "unusable file path"),
        ("https://example.com/org/repo/resolve/main/m.gguf", "not a Hugging Face URL"),
        ("https://huggingface.co/org/repo/discussions", "not a file URL"),
        ("https://huggingface.co/org", "does not name a repository"),
    ],
)
def test_bad_refs_say_what_is_accepted(text: str, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message) as caught:
        parse_ref(text)
    assert caught.value.param == "model"


def _files(*names: str, size: int = 100) -> list[RemoteFile]:
    return [RemoteFile(n, size * (i + 1), sha256=f"{i:064x}") for i, n in enumerate(names)]


def test_q4_k_m_is_the_default_when_present() -> None:
    files = _files("m-Q2_K.gguf", "m-Q4_K_M.gguf", "m-Q8_0.gguf", "m-F16.gguf", "README.md")
    choice = choose(variants(files), "o/r")
    assert choice.variant.quant == "Q4_K_M"
    assert "default" in choice.reason


def test_without_q4_k_m_the_closest_tradeoff_is_chosen_and_said() -> None:
    choice = choose(variants(_files("m-F16.gguf", "m-Q8_0.gguf", "m-Q5_K_M.gguf", "m-Q2_K.gguf")), "o/r")
    assert choice.variant.quant == "Q5_K_M"
    assert "no Q4_K_M" in choice.reason


def test_unknown_labels_fall_back_to_the_smallest_and_a_single_file_is_the_only_one() -> None:
    assert choose(variants(_files("alpha.gguf", "beta.gguf")), "o/r").variant.first.path == "alpha.gguf"
    only = choose(variants(_files("solo-Q6_K.gguf")), "o/r")
    assert only.variant.quant == "Q6_K" and "only" in only.reason


def test_split_parts_make_one_variant_in_order_and_an_incomplete_set_is_refused() -> None:
    files = _files(
        "Q8_0/m-Q8_0-00002-of-00002.gguf",
        "Q8_0/m-Q8_0-00001-of-00002.gguf",
        "m-Q4_K_M.gguf",
        "F16/m-F16-00001-of-00003.gguf",
    )
    found = {v.label: v for v in variants(files)}
    q8 = found["Q8_0"]
    assert [f.path for f in q8.files] == ["Q8_0/m-Q8_0-00001-of-00002.gguf", "Q8_0/m-Q8_0-00002-of-00002.gguf"]
    assert q8.size == sum(f.size for f in q8.files)
    assert choose(list(found.values()), "o/r", quant="q8_0").variant is q8
    # Naming any part brings the whole set.
    assert choose(list(found.values()), "o/r", filename="Q8_0/m-Q8_0-00002-of-00002.gguf").variant is q8
    with pytest.raises(HubFileNotFound, match="only 1 of the 3 parts"):
        choose(list(found.values()), "o/r", quant="F16")


def test_a_tag_found_only_in_a_file_name_says_so() -> None:
    choice = choose(variants(_files("m-Q4_K_M.gguf", "m-Q8_0.gguf", "m-UD-Q4_K_XL.gguf")), "o/r", quant="UD-Q4_K_XL")
    assert choice.variant.first.path == "m-UD-Q4_K_XL.gguf" and "file name contains" in choice.reason
    assert choose(variants(_files("m-Q4_K_M.gguf")), "o/r", quant="q4_k_m").reason == "Q4_K_M, as asked"


def test_a_missing_quant_lists_what_there_is() -> None:
    with pytest.raises(HubFileNotFound, match=r"no IQ2_XXS variant\. Available: Q4_K_M, Q8_0"):
        choose(variants(_files("m-Q4_K_M.gguf", "m-Q8_0.gguf")), "o/r", quant="IQ2_XXS")
    with pytest.raises(HubFileNotFound, match="no GGUF model files"):
        choose(variants(_files("model.safetensors", "mmproj-F16.gguf")), "o/r")


def test_projector_comes_from_the_same_folder_then_f16() -> None:
    files = _files(
        "m-Q4_K_M.gguf",
        "mmproj-F32.gguf",
        "mmproj-BF16.gguf",
        "mmproj-F16.gguf",
        "sub/m-Q8_0.gguf",
        "sub/mmproj-model-f32.gguf",
    )
    found = {v.label: v for v in variants(files)}
    assert "mmproj" not in " ".join(f.path for v in found.values() for f in v.files)
    chosen = projector_for(files, found["Q4_K_M"])
    assert chosen is not None and chosen.path == "mmproj-F16.gguf"
    in_folder = projector_for(files, found["Q8_0"])
    assert in_folder is not None and in_folder.path == "sub/mmproj-model-f32.gguf"
    assert projector_for(_files("m-Q4_K_M.gguf"), found["Q4_K_M"]) is None
