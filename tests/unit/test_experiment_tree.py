"""benchmarks.experiment_tree: an A/B tree from the package, a kept experiment's patch and launch-table settings."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from benchmarks.experiment_tree import REPOSITORY, TreeError, main, make_tree

LAUNCH = Path("src/polykernels/gated_delta_rule/launch.py")

# A patch as git format-patch writes them: a new module under src/ and a line in a doc, which a tree leaves out.
_PATCH = """From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
Subject: [PATCH] an experiment

---
diff --git a/docs/notes.md b/docs/notes.md
new file mode 100644
--- /dev/null
+++ b/docs/notes.md
@@ -0,0 +1 @@
+not part of a tree
diff --git a/src/polykernels/experiment_marker.py b/src/polykernels/experiment_marker.py
new file mode 100644
--- /dev/null
+++ b/src/polykernels/experiment_marker.py
@@ -0,0 +1 @@
+MARKER = 1
--
2.0
"""


def test_a_tree_takes_the_patchs_src_part_and_the_settings(tmp_path: Path) -> None:
    patch = tmp_path / "experiment.patch"
    patch.write_text(_PATCH)
    tree = tmp_path / "tree"
    done = make_tree(tree, None, [patch], ["gated_delta_rule.launch.HOPPER_WARP_BLOCK_INVERSE=False",
                                           "gated_delta_rule.launch.LEAD_BESIDE_GAIN=0.02"])
    assert (tree / "src/polykernels/experiment_marker.py").read_text() == "MARKER = 1\n"
    assert not (tree / "docs").exists()
    launch = (tree / LAUNCH).read_text()
    assert "\nHOPPER_WARP_BLOCK_INVERSE = False\n" in launch and "\nLEAD_BESIDE_GAIN = 0.02\n" in launch
    # Only those lines changed, and the working tree not at all.
    changed = [(a, b) for a, b in zip((REPOSITORY / LAUNCH).read_text().splitlines(), launch.splitlines(),
                                       strict=True) if a != b]
    assert sorted(b for _, b in changed) == ["HOPPER_WARP_BLOCK_INVERSE = False", "LEAD_BESIDE_GAIN = 0.02"]
    assert not list(tree.rglob("__pycache__"))
    assert done[-1] == "set LEAD_BESIDE_GAIN = 0.02"
    # Made again over itself: replaced, not patched twice.
    make_tree(tree, None, [patch], [])
    assert "\nHOPPER_WARP_BLOCK_INVERSE = True\n" in (tree / LAUNCH).read_text()


def test_a_tree_from_a_revision(tmp_path: Path) -> None:
    make_tree(tmp_path / "tree", "HEAD", [], [])
    committed = subprocess.run(["git", "show", f"HEAD:{LAUNCH.as_posix()}"], cwd=REPOSITORY, capture_output=True,
                               text=True, check=True).stdout
    assert (tmp_path / "tree" / LAUNCH).read_text() == committed


@pytest.mark.parametrize(("setting", "message"), [
    ("HOPPER_WARP_BLOCK_INVERSE=False", "expected MODULE.NAME=VALUE"),
    ("gated_delta_rule.launch.HOPPER_WARP_BLOCK_INVERSE=off", "not a Python literal"),
    ("gated_delta_rule.missing.HOPPER_WARP_BLOCK_INVERSE=False", "no module polykernels.gated_delta_rule.missing"),
    ("gated_delta_rule.launch.NO_SUCH_TABLE=1", "assigns NO_SUCH_TABLE on one line 0 times"),
    ("gated_delta_rule.launch.HOPPER_LEAD_BESIDE_PREPARE={}", "goes on past its line"),
], ids=["no-module", "not-literal", "unknown-module", "unknown-name", "multi-line"])
def test_a_setting_it_cannot_make_is_refused_by_name(tmp_path: Path, setting: str, message: str) -> None:
    with pytest.raises(TreeError, match=message):
        make_tree(tmp_path / "tree", None, [], [setting])


def test_a_patch_that_does_not_apply_or_a_folder_that_is_no_tree_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "stale.patch"
    stale.write_text(_PATCH.replace("new file mode 100644\n--- /dev/null\n+++ b/src/polykernels/experiment_marker.py",
                                    "--- a/src/polykernels/experiment_marker.py\n"
                                    "+++ b/src/polykernels/experiment_marker.py"))
    with pytest.raises(TreeError, match="does not apply to this tree"):
        make_tree(tmp_path / "tree", None, [stale], [])
    with pytest.raises(TreeError, match="no such file"):
        make_tree(tmp_path / "tree", None, [tmp_path / "missing.patch"], [])
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "keep.txt").write_text("mine")
    with pytest.raises(SystemExit):
        main([str(tmp_path / "other")])
    assert "is not an experiment tree" in capsys.readouterr().err
    assert (tmp_path / "other" / "keep.txt").read_text() == "mine"


def test_a_tree_inside_a_git_work_tree_still_takes_the_patch(tmp_path: Path) -> None:
    # git apply run inside another repository's work tree skips, without failing, paths it takes for outside.
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    patch = tmp_path / "experiment.patch"
    patch.write_text(_PATCH)
    tree = tmp_path / "build" / "tree"
    make_tree(tree, None, [patch], [])
    assert (tree / "src/polykernels/experiment_marker.py").read_text() == "MARKER = 1\n"


def test_a_patch_with_nothing_under_src_is_refused(tmp_path: Path) -> None:
    patch = tmp_path / "docs-only.patch"
    patch.write_text(_PATCH.split("diff --git a/src", maxsplit=1)[0] + "--\n2.0\n")
    with pytest.raises(TreeError, match="changes nothing under src/"):
        make_tree(tmp_path / "tree", None, [patch], [])
