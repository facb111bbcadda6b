"""The dashboard's job page names the job's image and the digest its attempts run (issue 37);
a bare job's page has no image row. The image and digest are escaped as any user input is."""

from __future__ import annotations

from sqlalchemy import update

from tests.plane import Plane, script
from trainyard.store.models import JobRow

DIGEST = "sha256:" + "0f" * 32


def test_the_job_page_shows_image_and_digest(tmp_path) -> None:
    p = Plane(tmp_path / "yard", start=False)
    try:
        boxed = p.submit(command=script("pass"), team="vision", container={"image": "nvcr.io#nvidia/cuda:12"})["id"]
        bare = p.submit(command=script("pass"), team="vision")["id"]
        c = p.client(p.admin_token)
        page = c.get(f"/ui/jobs/{boxed}").text
        assert '<code>nvcr.io/nvidia/cuda:12</code>' in page and "digest pinned at its first start" in page
        with p.cp.store.session.begin() as s:
            s.execute(update(JobRow).where(JobRow.id == boxed).values(image_digest=DIGEST))
        assert f'<code class="digest">{DIGEST}</code>' in c.get(f"/ui/jobs/{boxed}").text
        assert 'class="image"' not in c.get(f"/ui/jobs/{bare}").text
    finally:
        p.cp.stop()
