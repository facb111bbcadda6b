"""`#SBATCH` directives, as sbatch reads them."""

from __future__ import annotations

import pytest

from trainyard.cli.sbatch import SbatchError, parse_sbatch

SCRIPT = """#!/bin/bash
# a comment
#SBATCH -N 2-4
#SBATCH --gres=gpu:4 --time=1-12:00:00
#SBATCH -J pretrain --qos=batch
#SBATCH --account research
#SBATCH --output=logs/%j.out
#SBATCH --mem=64G -c 8
#SBATCH --comment=nightly

srun python train.py
#SBATCH -N 9
"""


def test_directives_map_to_submission_fields():
    opts = parse_sbatch(SCRIPT, "train.sh")
    assert opts.fields == {"nodes": "2-4", "gpus_per_node": 4, "time": "1-12:00:00", "name": "pretrain",
                           "class": "batch", "team": "research", "output": "logs/%j.out", "mem": "64G",
                           "cpus_per_task": 8}
    assert opts.warnings == ["train.sh:9: --comment is ignored by trainyard"]  # and line 12 is never read


@pytest.mark.parametrize("line, words", [
    ("#SBATCH --bogus=1", "unknown option '--bogus'"),
    ("#SBATCH -N", "needs a value"),
    ("#SBATCH -N 0", "at least 1"),
    ("#SBATCH -N 4-2", "maximum below its minimum"),
    ("#SBATCH --gres=cpu:2", "gpu:N"),
    ("#SBATCH --gpus-per-node=x", "--gpus-per-node: expected a GPU count N or Slurm's TYPE:N"),
    ("#SBATCH --gres=gpu:a100:x", "--gres: expected a GPU count"),
    ("#SBATCH -C a&", "-C: 'a&' ends where a feature name"),
    ("#SBATCH --constraint=[a*2]", "--constraint: '[' in"),
    ("#SBATCH -w n[1-", "-w: "),
    ("#SBATCH -n 0", "ntasks: must be at least 1"),
    ("#SBATCH --ntasks-per-node=two", "tasks_per_node: expected a whole number, got 'two'"),
    ("#SBATCH --time=soon", "duration"),
    ("#SBATCH --mem=lots", "mem: cannot read 'lots' as a memory size"),
    ("#SBATCH --mem-per-gpu=-4G", "mem_per_gpu"),
    ("#SBATCH --cpus-per-task=0", "cpus_per_task: must be at least 1"),
    ("#SBATCH 'unclosed", "cannot split"),
    ("#SBATCH", "no option"),
])
def test_a_malformed_line_is_an_error_naming_file_and_line(line, words):
    with pytest.raises(SbatchError) as e:
        parse_sbatch(f"#!/bin/sh\n{line}\necho hi\n", "job.sh")
    assert str(e.value).startswith("job.sh:2: ") and words in str(e.value)


def test_short_options_with_attached_values():
    assert parse_sbatch("#SBATCH -N2 -G8 -t30\n").fields == {"nodes": 2, "gpus": 8, "time": "30m"}


def test_qos_and_its_short_form_are_the_class():
    assert parse_sbatch("#SBATCH -q batch\n").fields == {"class": "batch"}
    assert parse_sbatch("#SBATCH --qos=interactive\n").fields == {"class": "interactive"}


@pytest.mark.parametrize("value, field", [("UNLIMITED", None), ("infinite", None), ("0", None), ("45", "45m"),
                                          ("2-12", "2-12"), ("1-2:30:00", "1-2:30:00")])
def test_time_limits_as_sbatch_reads_them(value, field):
    assert parse_sbatch(f"#SBATCH --time={value}\n").fields == {"time": field}


def test_tasks_per_node_is_sbatchs_alias_of_ntasks_per_node():
    from trainyard.cli.sbatch import parse_sbatch

    assert parse_sbatch("#!/bin/bash\n#SBATCH --tasks-per-node=2\ntrue\n").fields == {"tasks_per_node": 2}


def test_placement_options_map_to_fields():
    opts = parse_sbatch("#!/bin/bash\n#SBATCH --gres=gpu:a100:4 -C 'ib&nvme' -w n[1-2] -x n3\n"
                        "#SBATCH --exclusive --ntasks=8\ntrue\n", "p.sh")
    assert opts.fields == {"gpus_per_node": 4, "gpu_model": "a100", "constraint": "ib&nvme", "nodelist": "n[1-2]",
                           "exclude": "n3", "exclusive": True, "ntasks": 8}
    assert opts.warnings == []
