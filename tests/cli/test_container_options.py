"""pyxis's `--container-*` options on `yard submit` (issue 37, Deliver 1): the parsing of each
(cli/container_opts.py, cli/sbatch.py) and, on a real `yard up` with real `yard` processes, each
option stored as the job's container, bad values refused with exit 2 naming the option (and the
script's line), a registry the team may not use refused naming the rule, and `yard show`
printing the image. Jobs are submitted held: nothing here launches a container."""

from __future__ import annotations

import json

import pytest

from tests.cli.yard_process import job_id_of, stored, yard_process
from tests.plane import TWO_TEAMS
from trainyard.cli import container_opts
from trainyard.cli.sbatch import SbatchError, parse_sbatch

IMAGES = """
images:
  allowed_registries: ["127.0.0.1:5000", nvcr.io]
  teams: {vision: {allowed_registries: [nvcr.io]}}
"""


# -- parsing ---------------------------------------------------------------------------------------

def test_each_option_in_sbatch_lines_with_its_line() -> None:
    opts = parse_sbatch("#!/bin/bash\n#SBATCH -N 1\n#SBATCH --container-image=nvcr.io/nvidia/pytorch:24.01-py3\n"
                        "#SBATCH --container-mounts=/data:/data:ro+rprivate,/scratch --container-workdir /work\n"
                        "#SBATCH --container-env=HF_HOME,WANDB_API_KEY --no-container-mount-home\n"
                        "#SBATCH --container-readonly --container-entrypoint --container-remap-root\n"
                        "#SBATCH --container-im=nvcr.io\\#nvidia/cuda:12\n"  # abbreviated; '#' escaped
                        "srun python train.py\n", "job.sh")
    assert opts.container == {"image": "nvcr.io#nvidia/cuda:12", "mounts": "/data:/data:ro+rprivate,/scratch:/scratch",
                              "workdir": "/work", "env": ["HF_HOME", "WANDB_API_KEY"], "mount_home": False,
                              "writable": False, "entrypoint": True, "remap_root": True}
    assert {k: v for k, v in opts.lines.items() if k.startswith("container.")} == {
        "container.image": 7, "container.mounts": 4, "container.workdir": 4, "container.env": 5,
        "container.mount_home": 5, "container.writable": 6, "container.entrypoint": 6, "container.remap_root": 6}
    assert "container" not in opts.fields  # kept apart from the submission's plain fields


@pytest.mark.parametrize("line, words", [
    ("--container-image=Ubuntu:22.04", ["--container-image:", "lower case"]),
    ("--container-image=./image.sqsh", ["--container-image:", "file path"]),
    ("--container-image", ["needs a value"]),
    ("--container-mounts=data:/data", ["--container-mounts:", "absolute path"]),
    ("--container-mounts=/a:/b:ro+rw", ["--container-mounts:", "both 'ro' and 'rw'"]),
    ("--container-workdir=work", ["--container-workdir:", "absolute path"]),
    ("--container-env=A=B", ["--container-env:", "not a variable name"]),
    ("--container-env=,", ["--container-env:", "NAME[,NAME...]"]),
    ("--container-writeable", ["unknown option"]),
    # sbatch reads a '#' as a comment there: the image would silently be Docker Hub's library/nvcr.io
    ("--container-image=nvcr.io#nvidia/pytorch:24.01-py3", ["'#' starts a comment", "nvcr.io/...", "nvcr.io\\#..."]),
])
def test_a_bad_value_in_a_script_names_the_file_line_and_option(line, words) -> None:
    with pytest.raises(SbatchError) as e:
        parse_sbatch(f"#!/bin/bash\n#SBATCH -N 1\n#SBATCH {line}\ntrue\n", "job.sh")
    assert str(e.value).startswith("job.sh:3: "), str(e.value)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_the_command_line_wins_over_the_script() -> None:
    script = {"image": "ubuntu:22.04", "writable": False}
    line = container_opts.given("ubuntu:24.04", None, None, None, {"writable": None, "remap_root": True})
    assert container_opts.merged(script, line) == {"image": "ubuntu:24.04", "writable": False, "remap_root": True}
    assert container_opts.merged({}, container_opts.given(None, None, None, None, {"writable": None})) is None


# -- on a real plane -------------------------------------------------------------------------------

# One worker for this module's tests under `make test`'s --dist loadgroup: its module-scoped
# yard up starts once, not once per worker (about 4 s of CPU each).
pytestmark = pytest.mark.xdist_group("cli-container-options")


@pytest.fixture(scope="module")
def yard(tmp_path_factory):
    config = tmp_path_factory.mktemp("containers-cfg") / "cluster.yaml"
    config.write_text(TWO_TEAMS.read_text() + IMAGES)
    yield from yard_process(tmp_path_factory, "containers", config_file=config)


def shown(yard, jid: int) -> dict:
    return json.loads(yard("show", str(jid), "--json").stdout)


def test_every_option_on_the_command_line_is_stored(yard, tmp_path) -> None:
    p = yard("submit", "-H", "-A", "nlp", "--container-image=alice@127.0.0.1:5000#team/img:1.0",
             "--container-mounts=/data:/data:ro", "--container-workdir=/work", "--container-env=HF_HOME",
             "--container-mount-home", "--container-readonly", "--container-entrypoint", "--container-remap-root",
             "--", "python", "train.py", cwd=tmp_path)
    c = shown(yard, job_id_of(p))["container"]
    assert c == {"image": "127.0.0.1:5000/team/img:1.0",
                 "mounts": [{"src": "/data", "dst": "/data", "read_only": True, "flags": []}], "workdir": "/work",
                 "env": ["HF_HOME"], "mount_home": True, "writable": False, "entrypoint": True, "remap_root": True}
    text = yard("show", str(job_id_of(p))).stdout
    assert "image: 127.0.0.1:5000/team/img:1.0 (digest: pinned at its first start)" in text, text
    assert "container: --container-mounts=/data:/data:ro --container-workdir=/work --container-env=HF_HOME --container-mount-home --container-readonly --container-entrypoint --container-remap-root" in text, text


def test_a_script_with_the_command_line_over_it(yard, tmp_path) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH -A nlp\n#SBATCH --container-image=127.0.0.1:5000/a/b:1\n"
                      "#SBATCH --container-readonly\ntrue\n")
    jid = job_id_of(yard("submit", "-H", "--container-image=nvcr.io/nvidia/cuda:12", str(script), cwd=tmp_path))
    c = shown(yard, jid)["container"]
    assert c["image"] == "nvcr.io/nvidia/cuda:12" and c["writable"] is False


@pytest.mark.parametrize("args, says", [
    (["--container-image=Ubuntu"], "error: --container-image: repository name must be lower case"),
    (["--container-image=ubuntu", "--container-mounts=rel:/x"], "error: --container-mounts: source 'rel'"),
    (["--container-image=ubuntu", "--container-env=1X"], "error: --container-env: '1X' is not a variable name"),
])
def test_a_bad_value_on_the_command_line_is_exit_2_naming_the_option(yard, tmp_path, args, says) -> None:
    before = stored(yard)
    p = yard("submit", "-H", "-A", "nlp", *args, "--", "true", ok=False, cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.startswith(says) and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert stored(yard) == before


def test_a_registry_the_team_may_not_use_is_refused_naming_the_rule_and_the_line(yard, tmp_path) -> None:
    before = stored(yard)
    p = yard("submit", "-H", "-A", "vision", "--container-image=127.0.0.1:5000/a/b:1", "--", "true", ok=False,
             cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert "registry '127.0.0.1:5000' is not allowed for team 'vision' (images.teams.vision.allowed_registries: " \
           "nvcr.io)" in p.stderr, p.stderr
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH -A nlp\n#SBATCH --container-mounts=/data\n"
                      "#SBATCH --container-image=ghcr.io/x/y:1\ntrue\n")
    p = yard("submit", "-H", str(script), ok=False, cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.startswith(f"error: {script}:4: "), p.stderr
    assert "images.allowed_registries: 127.0.0.1:5000, nvcr.io" in p.stderr, p.stderr
    assert stored(yard) == before


def test_container_image_is_no_longer_refused(yard, tmp_path) -> None:
    p = yard("submit", "-H", "-A", "vision", "--container-image=nvcr.io#nvidia/pytorch:24.01-py3", "--", "true",
             cwd=tmp_path)
    assert shown(yard, job_id_of(p))["container"]["image"] == "nvcr.io/nvidia/pytorch:24.01-py3"


@pytest.mark.parametrize("args, says", [
    (["image", "pull", "Team/Img:1"], "error: IMAGE: repository name must be lower case"),
    (["image", "pull", "ubuntu", "--nodes", "node-[1"], "error: --nodes: "),
    (["image", "rm", "./x.sqsh"], "error: IMAGE: './x.sqsh' is a file path"),
])
def test_yard_image_checks_its_arguments_before_asking(yard, args, says) -> None:
    p = yard(*args, ok=False)
    assert p.returncode == 2 and p.stderr.startswith(says), p.stderr


def test_yard_queue_shows_the_image_when_asked(yard, tmp_path) -> None:
    jid = job_id_of(yard("submit", "-H", "-A", "vision", "--container-image=nvcr.io/nvidia/cuda:12", "--", "true",
                         cwd=tmp_path))
    bare = job_id_of(yard("submit", "-H", "-A", "vision", "--", "true", cwd=tmp_path))
    lines = yard("queue", "-O", "id,image:40,reason", "-h").stdout.splitlines()
    rows = {int(x.split()[0]): x.split()[1:] for x in lines}
    assert rows[jid] == ["nvcr.io/nvidia/cuda:12", "JobHeldUser"], lines
    assert rows[bare] == ["JobHeldUser"], lines  # a bare job: an empty image column


def test_yard_run_names_the_way_that_works_for_an_image(yard, tmp_path) -> None:
    p = yard("run", "llama-pretrain", "--out", str(tmp_path / "o"), "--container-image=Ubuntu", ok=False)
    assert p.returncode == 2 and p.stderr.startswith("error: --container-image: repository name must be"), p.stderr
    p = yard("run", "llama-pretrain", "--out", str(tmp_path / "o"), "--container-image=ubuntu", ok=False)
    assert p.returncode == 2 and "yard submit --recipe RECIPE --container-image IMAGE" in p.stderr, p.stderr
    assert not (tmp_path / "o").exists()  # nothing started, nothing written


def test_a_recipe_in_an_image_runs_the_images_python(yard, tmp_path) -> None:
    jid = job_id_of(yard("submit", "-H", "-A", "nlp", "--recipe", "llama-pretrain", "--set", "steps=2",
                         "--container-image=127.0.0.1:5000/team/torch:1", cwd=tmp_path))
    assert shown(yard, jid)["command"][:3] == ["python3", "-m", "trainyard.recipes"]
    bare = job_id_of(yard("submit", "-H", "-A", "nlp", "--recipe", "llama-pretrain", "--set", "steps=2", cwd=tmp_path))
    assert shown(yard, bare)["command"][0].startswith("/")  # the host's interpreter, as before
