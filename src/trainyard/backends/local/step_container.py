"""pyxis's `--container-*` options on `srun` inside a batch script (local backend): the job's image.

A batch job with an image runs its script in its container, and the tasks its `srun` starts are
the script's children: they run in the same container (as pyxis runs every local task of a step in
one container). A published script often repeats the job's options on each `srun` line
(`srun --container-image=$IMAGE --container-mounts=$DATA python train.py`); those are accepted when
they ask for what the job has — the same image (by name, tag and digest, in enroot's or Docker's
form) and the same mounts, working directory, variables and flags — and refused, naming the
option, when they ask for something else: a step in an image or with mounts of its own would need a
second container, which this backend does not make (give them to the job: `#SBATCH
--container-image=…`). A job without an image refuses them all the same way.

Standard library only, loaded by path (`by_path.load`) by srun.py, which runs with -I -S.
"""

from __future__ import annotations

from typing import Any

NOT_HERE = ("name", "save")  # pyxis's named and saved containers: a container lives as long as its rank here


class StepContainerError(Exception):
    """A step's container option this backend cannot honour; the message names it."""


def _load(name: str) -> Any:
    try:
        from trainyard.backends.rundir import by_path  # the plane's tests import this module
    except ImportError:
        import by_path  # type: ignore[no-redef]  # run by path: srun.py put the run-dir layer on sys.path
    return by_path.load(name)


def _flags() -> Any:
    return _load("spec/container_flags")


def valued() -> dict[str, str]:
    """srun's valued container options → their key (the job's own, and pyxis's two refused here)."""
    return {**_flags().VALUED, "--container-name": "name", "--container-save": "save"}


def flags() -> dict[str, tuple[str, bool]]:
    """srun's container flags → (key, value), as the job's options have them."""
    return dict(_flags().FLAGS)


def check(asked: dict[str, Any], job: dict[str, Any] | None) -> None:
    """Raise `StepContainerError` unless every option in `asked` (srun's, by the keys above) is the
    job's own (`job`: batch.json's `container`, the job's `ContainerOptions` record with `ref` and
    `digest`; None when the job has no image)."""
    if not asked:
        return
    first = next(iter(asked))
    if job is None:
        raise StepContainerError(f"--container-{first.replace('_', '-')}: this job runs no image, and a step in an "
                                 "image of its own is not supported here; give the job its image "
                                 "(#SBATCH --container-image=…)")
    for key in NOT_HERE:
        if key in asked:
            raise StepContainerError(f"--container-{key}: not supported (a container lives as long as its task here)")
    image_ref = _load("spec/image_ref")
    if "image" in asked:
        try:
            mine = image_ref.parse_image(str(asked["image"]))
        except ValueError as e:
            raise StepContainerError(str(e)) from None
        theirs = image_ref.parse_image(job["ref"])
        same = mine.name == theirs.name and (mine.digest in (None, job["digest"])) \
            and (mine.digest is not None or mine.tag == theirs.tag)
        if not same:
            raise StepContainerError(f"--container-image={asked['image']}: the job's image is {job['ref']}; its steps "
                                     "run in it (a step in an image of its own is not supported here)")
    if "mounts" in asked:
        mounts = _load("spec/container_mounts")
        try:
            step = [(m.src, m.dst, m.read_only) for m in mounts.parse_mounts(str(asked["mounts"]))]
        except ValueError as e:
            raise StepContainerError(str(e)) from None
        have = [(m["src"], m["dst"], bool(m.get("read_only"))) for m in job.get("mounts") or ()]
        if sorted(step) != sorted(have):
            raise StepContainerError(f"--container-mounts={asked['mounts']}: not the job's mounts; a step's own mounts "
                                     "are not supported here (give them to the job: #SBATCH --container-mounts=…)")
    if "workdir" in asked and asked["workdir"] != (job.get("workdir") or None):
        raise StepContainerError(f"--container-workdir={asked['workdir']}: not the job's; give it to the job")
    if "env" in asked:
        names = sorted(n for n in str(asked["env"]).split(",") if n)
        if names != sorted(job.get("env") or ()):
            raise StepContainerError(f"--container-env={asked['env']}: not the job's; give it to the job")
    for key, value in asked.items():
        if key in ("mount_home", "writable", "entrypoint", "remap_root") and bool(job.get(key)) != value:
            flag = next(f for f, (k, v) in flags().items() if k == key and v == value)
            raise StepContainerError(f"{flag}: not the job's choice; give it to the job")
