"""Issue 35's #SBATCH habits, as sbatch reads them (parsing only; tests/cli/test_options_issue35.py
runs them on a real plane): site options accepted and recorded, abbreviations, --gres=none,
--mem-per-cpu and --gpus-per-task as fields, and the line each field came from."""

from __future__ import annotations

import pytest

from trainyard.cli import prefixes
from trainyard.cli.sbatch import SbatchError, parse_sbatch

SITE = """#!/bin/bash
#SBATCH --hint=nomultithread
#SBATCH --distribution=block:cyclic
#SBATCH --gres-flags=enforce-binding
#SBATCH --tmp=20G
#SBATCH --get-user-env
#SBATCH --threads-per-core=1
#SBATCH --wckey=vision-ablation
#SBATCH -p train
srun python train.py
"""


def test_site_template_options_are_recorded_not_refused():
    opts = parse_sbatch(SITE, "site.sh")
    assert opts.env == {"SLURM_HINT": "nomultithread", "SLURM_DISTRIBUTION": "block:cyclic",
                        "SLURM_GRES_FLAGS": "enforce-binding", "TRAINYARD_MIN_TMP_DISK_MIB": "20480",
                        "SLURM_GET_USER_ENV": "1", "SLURM_THREADS_PER_CORE": "1", "SLURM_WCKEY": "vision-ablation"}
    assert opts.fields == {"pool": "train"} and opts.lines == {"pool": 9}
    assert opts.warnings == []


@pytest.mark.parametrize("line, says", [
    ("--hint=fast", "--hint: expected compute_bound"),
    ("--distribution=diagonal", "--distribution: expected block"),
    ("--tmp=lots", "--tmp: cannot read 'lots'"),
    ("--threads-per-core=0", "--threads-per-core: expected a whole number"),
    ("--gres-flags=bind-everything", "--gres-flags: expected enforce-binding"),
])
def test_a_bad_value_of_a_recorded_option_names_the_line(line, says):
    with pytest.raises(SbatchError) as e:
        parse_sbatch(f"#!/bin/sh\n#SBATCH -N 1\n#SBATCH {line}\ntrue\n", "job.sh")
    assert str(e.value).startswith("job.sh:3: ") and says in str(e.value)


@pytest.mark.parametrize("line, fields", [
    ("--tim=10", {"time": "10m"}),          # --time, not --time-min: --time-min extends it
    ("--job-n=x", {"name": "x"}),
    ("--ntasks-per=2", {"tasks_per_node": 2}),
    ("--part=gpu", {"pool": "gpu"}),
    ("--exclus", {"exclusive": True}),      # (--exclu: --exclude or --exclusive, refused)
])
def test_unambiguous_prefixes_are_the_option(line, fields):
    assert parse_sbatch(f"#SBATCH {line}\n").fields == fields


def test_an_ambiguous_prefix_is_refused_naming_the_candidates():
    with pytest.raises(SbatchError) as e:
        parse_sbatch("#!/bin/sh\n#SBATCH --mem-per=4G\n", "a.sh")
    assert str(e.value) == "a.sh:2: --mem-per is ambiguous: it could be --mem-per-cpu, --mem-per-gpu"


def test_a_prefix_of_a_refused_option_is_refused_with_its_reason():
    with pytest.raises(SbatchError) as e:
        parse_sbatch("#SBATCH --no-req\n", "a.sh")
    assert "--no-requeue: not supported" in str(e.value)


def test_prefix_rule():
    known = ["--time", "--time-min", "--mem", "--mem-per-gpu", "--mem-per-cpu"]
    assert prefixes.expand("--tim", known) == "--time"
    assert prefixes.expand("--time-m", known) == "--time-min"
    assert prefixes.expand("--mem", known) == "--mem"
    assert prefixes.expand("--bogus", known) is None
    with pytest.raises(prefixes.AmbiguousOption):
        prefixes.expand("--mem-per-", known)


def test_gres_none_mem_per_cpu_and_gpus_per_task():
    opts = parse_sbatch("#SBATCH --gres=none --mem-per-cpu=2G\n#SBATCH --gpus-per-task=A100:2 -n 2\n")
    assert opts.fields == {"mem_per_cpu": "2G", "gpu_model": "A100", "gpus_per_task": 2, "ntasks": 2}
    assert opts.lines == {"mem_per_cpu": 1, "gpu_model": 2, "gpus_per_task": 2, "ntasks": 2}


def test_gpus_per_task_is_no_longer_refused():
    assert parse_sbatch("#SBATCH --gpus-per-task=1\n").fields == {"gpus_per_task": 1}
