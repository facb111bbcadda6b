"""`--dataset` and `#SBATCH --dataset` as the CLI reads them (cli/dataset_opts.py, cli/sbatch.py):
lists joined by commas, repeatable, each dataset remembering its script line."""

from __future__ import annotations

import pytest

from trainyard.cli import dataset_opts
from trainyard.cli.sbatch import SbatchError, parse_sbatch


def test_commas_and_repeats_keep_their_order():
    assert dataset_opts.parse_all(["corpus:v1,vocab", "images:2026-12.1"]) == ["corpus:v1", "vocab", "images:2026-12.1"]


@pytest.mark.parametrize("raw", ["", "a,,b", "Corpus", "corpus:", ":v1", "corpus:v 1", "9x", "a:b:c", "corpus:../x"])
def test_a_malformed_one_names_the_option(raw: str):
    with pytest.raises(ValueError, match="--dataset"):
        dataset_opts.parse(raw)


def test_sbatch_lines_add_up_and_each_dataset_keeps_its_line():
    opts = parse_sbatch("#!/bin/sh\n#SBATCH -N 1\n#SBATCH --dataset=corpus:v1,vocab\n#SBATCH --dataset images\ntrue\n",
                        "job.sh")
    assert opts.fields["datasets"] == ["corpus:v1", "vocab", "images"]
    assert (opts.lines["datasets.0"], opts.lines["datasets.1"], opts.lines["datasets.2"]) == (3, 3, 4)
    with pytest.raises(SbatchError, match="job.sh:2: --dataset"):
        parse_sbatch("#!/bin/sh\n#SBATCH --dataset=Nope\n", "job.sh")
