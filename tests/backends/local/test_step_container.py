"""pyxis's --container-* on a step inside a batch script (backends/local/step_container.py): the
job's own image and options are accepted, anything else is refused naming the option."""

from __future__ import annotations

import pytest

from trainyard.backends.local.srun import SrunError, parse_args
from trainyard.backends.local.step_container import StepContainerError, check

DIGEST = "sha256:" + "ab" * 32
JOB = {"image": "nvcr.io/nvidia/pytorch:24.01-py3", "ref": f"nvcr.io/nvidia/pytorch:24.01-py3@{DIGEST}",
       "digest": DIGEST, "mounts": [{"src": "/data", "dst": "/data", "read_only": True, "flags": []}],
       "workdir": None, "env": ["HF_HOME"], "mount_home": False, "writable": True, "entrypoint": False,
       "remap_root": False}


def _asked(*argv: str) -> dict:
    opts, command = parse_args([*argv, "python3", "train.py"])
    assert command == ["python3", "train.py"]
    return opts.get("container") or {}


def test_the_jobs_own_image_and_options_in_either_form_are_accepted():
    check(_asked("--container-image=nvcr.io#nvidia/pytorch:24.01-py3", "--container-mounts", "/data:/data:ro",
                 "--container-env=HF_HOME", "--no-container-mount-home", "--container-writable"), JOB)
    check(_asked(f"--container-image=nvcr.io/nvidia/pytorch@{DIGEST}"), JOB)
    check({}, None)  # no option, no image: nothing to say


@pytest.mark.parametrize(("argv", "named"), [
    (("--container-image=nvcr.io#nvidia/pytorch:24.02-py3",), "the job's image is"),
    (("--container-image=ubuntu:24.04",), "the job's image is"),
    (("--container-mounts=/scratch:/scratch",), "not the job's mounts"),
    (("--container-workdir=/w",), "--container-workdir"),
    (("--container-readonly",), "--container-readonly"),
    (("--container-name=keep",), "--container-name"),
])
def test_anything_else_is_refused_naming_the_option(argv, named):
    with pytest.raises(StepContainerError) as e:
        check(_asked(*argv), JOB)
    assert named in str(e.value)


def test_a_job_without_an_image_refuses_a_steps_image():
    with pytest.raises(StepContainerError) as e:
        check(_asked("--container-image=ubuntu:24.04"), None)
    assert "this job runs no image" in str(e.value) and "#SBATCH --container-image" in str(e.value)


def test_a_valued_container_option_without_its_value_is_srun_s_error():
    with pytest.raises(SrunError, match="--container-image needs a value"):
        parse_args(["--container-image"])
