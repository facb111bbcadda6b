"""Where a recipe's relative `export:` goes (`recipes/export.recipe_target`): the run's directory,
and under a control plane the job directory's `exports/`, the one directory there its owner may
write (issue 35 point 6: `--set export=hf` failed for every non-root user)."""

from __future__ import annotations

from trainyard.contracts import JobDir
from trainyard.recipes.export import recipe_target
from trainyard.recipes.spec import RecipeSpec, load_recipe


def spec(export: str) -> RecipeSpec:
    return load_recipe("llama-pretrain", [f"export={export}"])


def test_relative_exports_go_to_the_job_dirs_exports_under_a_plane_and_to_the_run_dir_elsewhere(tmp_path, monkeypatch):
    jd = JobDir.of(tmp_path, 7, "abc")
    jd.checkpoints.mkdir(parents=True)
    monkeypatch.delenv("TRAINYARD_JOB_ID", raising=False)
    assert recipe_target(spec("hf"), jd.checkpoints) == jd.root.resolve() / "hf"  # yard run: <out>/hf
    jd.exports.mkdir()
    monkeypatch.setenv("TRAINYARD_JOB_ID", "7")
    assert recipe_target(spec("hf"), jd.checkpoints) == jd.exports.resolve() / "hf"
    assert recipe_target(spec(str(tmp_path / "abs")), jd.checkpoints) == (tmp_path / "abs").resolve()
