"""`#SBATCH` directives, as sbatch reads them."""

from __future__ import annotations

import pytest

from trainyard.cli.sbatch import SbatchError, parse_sbatch

SCRIPT = """#!/bin/bash
# a comment
#SBATCH -N 2-4
#SBATCH --gres=gpu:a100:4 --time=1-12:00:00
#SBATCH -J pretrain --qos=batch
#SBATCH --account research
#SBATCH --output=logs/%j.out
#SBATCH --mem=64G

srun python train.py
#SBATCH -N 9
"""


def test_directives_map_to_submission_fields():
    opts = parse_sbatch(SCRIPT, "train.sh")
    assert opts.fields == {"nodes": "2-4", "gpus_per_node": 4, "time": "1-12:00:00", "name": "pretrain",
                           "class": "batch", "team": "research", "output": "logs/%j.out"}
    assert opts.warnings == ["train.sh:8: --mem is ignored by trainyard"]  # and line 11 is never read


@pytest.mark.parametrize("line, words", [
    ("#SBATCH --bogus=1", "unknown option '--bogus'"),
    ("#SBATCH -N", "needs a value"),
    ("#SBATCH -N 0", "at least 1"),
    ("#SBATCH -N 4-2", "maximum below its minimum"),
    ("#SBATCH --gres=cpu:2", "gpu:N"),
    ("#SBATCH --gpus-per-node=x", "gpus_per_node"),
    ("#SBATCH --time=soon", "duration"),
    ("#SBATCH 'unclosed", "cannot split"),
    ("#SBATCH", "no option"),
])
def test_a_malformed_line_is_an_error_naming_file_and_line(line, words):
    with pytest.raises(SbatchError) as e:
        parse_sbatch(f"#!/bin/sh\n{line}\necho hi\n", "job.sh")
    assert str(e.value).startswith("job.sh:2: ") and words in str(e.value)


def test_short_options_with_attached_values():
    assert parse_sbatch("#SBATCH -N2 -G8 -t30\n").fields == {"nodes": 2, "gpus": 8, "time": "30m"}
