"""`yard submit` never guesses (issue 17, item 5): an option it does not know is an error naming it,
GPU counts and time limits read as Slurm writes them, `-q` the same on the command line and in
`#SBATCH`. Real `yard` processes against a real `yard up`; a refused submission stores nothing."""

from __future__ import annotations

import json

import pytest

from tests.cli.yard_process import job_id_of, stored, yard_process


# One worker for this module's tests under `make test`'s --dist loadgroup: its module-scoped
# yard up starts once, not once per worker (about 4 s of CPU each).
pytestmark = pytest.mark.xdist_group("cli-submit-never-guesses")


@pytest.fixture(scope="module")
def yard(tmp_path_factory):
    yield from yard_process(tmp_path_factory, "strict")


def show(yard, jid: int) -> dict:
    return json.loads(yard("show", str(jid), "--json").stdout)


def refused(yard, *args: str, cwd=None):
    """Runs a submission that must be refused: exit 2, one `error:` line, nothing stored."""
    before = stored(yard)
    p = yard("submit", *args, ok=False, cwd=cwd)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert p.stderr.startswith("error: ") and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert stored(yard) == before
    return p.stderr


@pytest.mark.parametrize("args, option", [
    (["--frobnicate", "4G", "-G", "1", "--", "true"], "--frobnicate"),
    (["-A", "nlp", "-G", "1", "--nodelst=n1", "--", "true"], "--nodelst"),
    (["-A", "nlp", "-Z", "--", "true"], "-Z"),
    (["-A", "nlp", "--bogus", "job.sh"], "--bogus"),
])
def test_an_unknown_option_before_the_command_is_an_error_naming_it(yard, args, option):
    err = refused(yard, *args)
    assert err.startswith(f"error: {option}: yard submit has no such option"), err


def test_near_misses_are_named(yard):
    # (a mere abbreviation, --ntasks-per-nod, is the option, as in sbatch: test_options_issue35.py)
    err = refused(yard, "-A", "nlp", "--ntasks-per-nodes", "2", "--", "true")
    assert "(did you mean " in err and "--ntasks-per-node" in err, err


def test_mem_is_honoured_and_never_part_of_the_command(yard):
    jid = job_id_of(yard("submit", "-A", "nlp", "-H", "--mem", "4G", "-G", "1", "--", "true"))
    j = show(yard, jid)
    assert j["command"] == ["true"] and j["mem_mib"] == 4096, j
    yard("cancel", str(jid))


def test_options_after_the_command_are_the_commands_own_as_with_srun(yard):
    jid = job_id_of(yard("submit", "-A", "nlp", "-H", "-G", "1", "echo", "--mem", "4G", "-G", "2"))
    j = show(yard, jid)
    assert j["command"] == ["echo", "--mem", "4G", "-G", "2"] and j["gpus"] == 1 and j["mem_mib"] is None
    yard("cancel", str(jid))


@pytest.mark.parametrize("args, words", [
    # a GPU model is a placement constraint now (test_placement_options.py); one no node has is refused
    (["--gpus=a100:2"], ["--gpus/--gres: no node of pool 'default' has GPU model 'a100'", "['emulated']"]),
    (["-G", "h100:1"], ["GPU model 'h100'"]),
    (["--gpus-per-node=a100:2"], ["GPU model 'a100'"]),
    (["--gpus=two"], ["--gpus: expected a GPU count N or Slurm's TYPE:N", "'two'"]),
    (["--gpus=0"], ["--gpus: must be at least 1"]),
    (["-N"], ["'-N' requires an argument"]),
    (["--gpu-mem", "lots"], ["Invalid value for '--gpu-mem'"]),
])
def test_bad_values_name_the_option_and_no_raw_python_message(yard, args, words):
    err = refused(yard, "-A", "nlp", *args, "--", "true") if args != ["-N"] else refused(yard, "-A", "nlp", "-N")
    for w in words:
        assert w in err, err
    assert "invalid literal" not in err and "Traceback" not in err


def test_a_gpu_model_no_node_has_in_a_script_is_refused(yard, tmp_path):
    for line, words in (("#SBATCH --gres=gpu:a100:2", "GPU model 'a100'"),
                        ("#SBATCH --gpus=a100:2", "GPU model 'a100'"),
                        ("#SBATCH --gpus-per-node=h100:4", "GPU model 'h100'")):
        script = tmp_path / "model.sh"
        script.write_text(f"#!/bin/bash\n#SBATCH -A nlp\n{line}\ntrue\n")
        err = refused(yard, str(script), cwd=tmp_path)
        assert f"--gpus/--gres: no node of pool 'default' has {words}" in err, err


def test_qos_is_the_class_on_the_command_line_and_in_sbatch_alike(yard, tmp_path):
    script = tmp_path / "qos.sh"
    script.write_text("#!/bin/bash\n#SBATCH -A nlp -H\n#SBATCH -q batch\ntrue\n")
    from_script = job_id_of(yard("submit", str(script), cwd=tmp_path))
    assert show(yard, from_script)["class"] == "batch"
    overridden = job_id_of(yard("submit", "-q", "interactive", str(script), cwd=tmp_path))
    assert show(yard, overridden)["class"] == "interactive"
    long_form = job_id_of(yard("submit", "--qos=batch", "-A", "nlp", "-H", "--", "true"))
    assert show(yard, long_form)["class"] == "batch"
    err = refused(yard, "-q", "vip", "-A", "nlp", "--", "true")
    assert "class" in err and "vip" in err
    for jid in (from_script, overridden, long_form):
        yard("cancel", str(jid))


@pytest.mark.parametrize("value, seconds", [
    ("UNLIMITED", None), ("infinite", None), ("0", None), ("90", 5400.0), ("5:30", 330.0), ("1:02:03", 3723.0),
    ("2-0", 172800.0), ("1-2:30", 95400.0), ("1-00:00:10", 86410.0),
])
def test_time_limits_as_slurm_writes_them(yard, value, seconds):
    jid = job_id_of(yard("submit", "-A", "nlp", "-H", f"--time={value}", "--", "true"))
    assert show(yard, jid)["time_limit_s"] == seconds
    yard("cancel", str(jid))


def test_unlimited_on_the_command_line_wins_over_the_scripts_limit(yard, tmp_path):
    script = tmp_path / "limited.sh"
    script.write_text("#!/bin/bash\n#SBATCH -A nlp -H --time=1:00:00\ntrue\n")
    jid = job_id_of(yard("submit", "-t", "UNLIMITED", str(script), cwd=tmp_path))
    assert show(yard, jid)["time_limit_s"] is None
    yard("cancel", str(jid))
    script.write_text("#!/bin/bash\n#SBATCH -A nlp -H --time=INFINITE\ntrue\n")
    jid = job_id_of(yard("submit", str(script), cwd=tmp_path))
    assert show(yard, jid)["time_limit_s"] is None
    yard("cancel", str(jid))


def test_unlimited_still_means_the_classs_max_run_time(yard):
    """interactive has an 8h max run time: UNLIMITED is accepted, a 9h limit is not."""
    jid = job_id_of(yard("submit", "-A", "nlp", "-H", "-q", "interactive", "-t", "UNLIMITED", "--", "true"))
    assert show(yard, jid)["time_limit_s"] is None
    yard("cancel", str(jid))
    assert "-t 9:00:00 is over class 'interactive''s limit of 08:00:00" in refused(
        yard, "-A", "nlp", "-q", "interactive", "-t", "9:00:00", "--", "true")


def test_words_after_a_batch_script_are_refused_not_run_as_a_command(yard, tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\n#SBATCH -A nlp -H\necho hi\n")
    script.chmod(0o755)
    err = refused(yard, str(script), "--parsable", cwd=tmp_path)
    assert f"{script}: arguments after a batch script (--parsable) are not passed to it" in err, err
    jid = job_id_of(yard("submit", "-A", "nlp", "-H", "--", str(script), "--lr", "3", cwd=tmp_path))
    assert show(yard, jid)["command"] == [str(script), "--lr", "3"]  # after `--`: a command, as asked
    yard("cancel", str(jid))
