"""cli/shared_options.py: `yard alloc` and `yard srun` take `yard submit`'s options (one declaration),
but the batch-only ones; `yard submit` keeps every option it had."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from trainyard.cli import alloc, jobs, srun_cmd
from trainyard.cli.main import app
from trainyard.cli.shared_options import with_options


def _options(fn: Any) -> set[str]:
    return set(inspect.signature(fn).parameters)


def test_submit_keeps_its_options_and_alloc_and_srun_take_them_but_the_batch_only_ones() -> None:
    asked = _options(jobs.job_request) - {"args", "after_dashdash", "interactive"}
    assert {"nodes", "gpus", "time_limit", "team", "job_class", "nodelist", "c_image"} <= asked
    assert _options(jobs.submit) == {"ctx", "parsable", "as_json"} | asked
    assert _options(alloc.alloc) == {"ctx"} | (asked - set(alloc.BATCH_ONLY))
    assert _options(srun_cmd.srun) == {"ctx", "pty"} | (asked - set(alloc.BATCH_ONLY))
    assert set(alloc.BATCH_ONLY) <= asked  # each batch-only option is one job_request has


def test_the_help_of_alloc_lists_sallocs_options_and_not_the_batch_ones() -> None:
    out = CliRunner().invoke(app, ["alloc", "--help"], env={"COLUMNS": "200"}).output
    for opt in ("--nodes", "--gpus", "--gpus-per-node", "--ntasks", "--cpus-per-task", "--mem", "--time", "--account",
                "--qos", "--partition", "--job-name", "--nodelist", "--exclude", "--constraint", "--exclusive",
                "--container-image"):
        assert opt in out, opt
    for opt in ("--output", "--array", "--wrap", "--recipe", "--parsable"):
        assert opt not in out, opt


def test_an_option_of_both_is_refused_at_import() -> None:
    def source(nodes: str = typer.Option(None, "-N")) -> None:
        pass

    with pytest.raises(TypeError, match="nodes"):
        @with_options(source)
        def command(ctx: typer.Context, nodes: str = typer.Option(None, "--nodes"), **options: Any) -> None:
            pass
