"""A disk too small for a download is the service's one `InsufficientStorage`, as a full data disk is."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmsp_tray import errors
from lmsp_tray.hub import errors as hub_errors
from lmsp_tray.hub.space import check_space, disk_full


def test_one_class_caught_by_one_except(tmp_path: Path) -> None:
    assert not hasattr(hub_errors, "InsufficientStorage")
    with pytest.raises(errors.InsufficientStorage) as caught:
        check_space(tmp_path, 10**9, free_space=lambda folder: 10**6)
    problem = caught.value.to_problem()
    assert (problem["status"], problem["code"], problem["title"]) == (
        507,
        "insufficient_storage",
        "Insufficient storage",
    )
    assert isinstance(disk_full(tmp_path, 5, 10), errors.InsufficientStorage)
    assert type(errors.error_from_problem(problem)) is errors.InsufficientStorage
