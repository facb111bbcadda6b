"""An exported model's lineage names the image its job ran in (issue 37): read from the job's
environment (`contracts.JobVar.IMAGE`, `IMAGE_DIGEST`, set by the launch of a job in an image)
when the export is the recipe's own, in the job; never from a shell's environment (`yard export`).
(The whole export, with every other lineage field: test_export_recipe.py.)"""

from __future__ import annotations

from trainyard.contracts import JobVar
from trainyard.recipes.export import image_lineage

DIGEST = "sha256:" + "ab" * 32


def test_the_jobs_image_and_digest_in_the_job_and_nothing_elsewhere(monkeypatch) -> None:
    assert image_lineage("recipe") == {"image": None, "image_digest": None}  # a bare job
    monkeypatch.setenv(JobVar.IMAGE, "127.0.0.1:5000/team/torch:1")
    monkeypatch.setenv(JobVar.IMAGE_DIGEST, DIGEST)
    assert image_lineage("recipe") == {"image": "127.0.0.1:5000/team/torch:1", "image_digest": DIGEST}
    assert image_lineage("yard export") == {"image": None, "image_digest": None}
