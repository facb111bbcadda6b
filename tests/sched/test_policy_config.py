"""Policy as configuration: policies built by name from parameters (`sched/policy.py`), and the
cluster configuration's `scheduler:` section that validates them (`spec.models.SchedulerSpec`).

The default must stay exactly today's policy (every simulator figure was measured with it), and
every mistake an operator can make in the section must name the field and its line.
"""

from __future__ import annotations

import re

import pytest

from trainyard.sched.baselines import Fifo, Slurm, Tiresias
from trainyard.sched.engine import EngineParams, TrainyardPolicy
from trainyard.sched.ordering import OrderingParams
from trainyard.sched.policy import get_policy, policy_names, policy_params, resolved_params
from trainyard.spec.models import EXAMPLE_CONFIG, ConfigError, load_config, parse_config

BASE = EXAMPLE_CONFIG.read_text()
BASE = BASE[:BASE.index("# Which scheduling policy runs")]  # the example less its scheduler section


# -- sched/policy.py: built by name, from plain values --------------------------------------------


def test_without_parameters_each_policy_is_its_factorys_default():
    assert get_policy("trainyard").params == EngineParams() == TrainyardPolicy().params
    assert get_policy("trainyard", {}).params == EngineParams()
    t = get_policy("tiresias")
    assert (t.thresholds, t.starve_limit) == (Tiresias().thresholds, Tiresias().starve_limit)
    assert isinstance(get_policy("fifo"), Fifo)


def test_nested_parameters_land_in_the_dataclasses():
    p = get_policy("trainyard", {"max_reservations": 1, "ordering": {"reserve_at": 0.2}})
    assert p.params == EngineParams(max_reservations=1, ordering=OrderingParams(reserve_at=0.2))
    s = get_policy("slurm", {"w_age": 5.0})
    assert isinstance(s, Slurm) and s.w_age == 5.0 and s.w_qos == Slurm().w_qos
    assert get_policy("tiresias", {"thresholds": (900.0, 100.0)}).thresholds == (100.0, 900.0)


def test_parameters_are_read_from_each_policys_own_code():
    names = {n: [p.name for p in policy_params(n)] for n in policy_names()}
    assert names["fifo"] == names["kueue"] == names["partition"] == []
    assert names["slurm"] == ["w_age", "w_fairshare", "w_qos", "max_age_s"]
    assert names["tiresias"] == ["thresholds", "starve_limit"]
    trainyard = {p.name: p for p in policy_params("trainyard")}
    assert list(trainyard)[0] == "ordering" and trainyard["ordering"].type is OrderingParams
    assert [p.name for p in trainyard["ordering"].group] == ["reserve_at", "aging_weight", "fairshare_weight",
                                                             "unknown_runtime_s", "las_reserve_at"]
    assert list(trainyard) == ["ordering", "backfill", "preemption", "share", "las", "overdue", "moves"]
    preemption = {p.name: p for p in trainyard["preemption"].group}
    assert preemption["reclaim_after_s"].default == EngineParams().reclaim_after_s


def test_resolved_parameters_fill_in_the_defaults():
    r = resolved_params("trainyard", {"ordering": {"aging_weight": 1.0}})
    assert r["ordering"] == {"reserve_at": 0.05, "aging_weight": 1.0, "fairshare_weight": 0.5,
                             "unknown_runtime_s": 14400.0, "las_reserve_at": 0.5}
    assert r["backfill"]["max_reservations"] == 4 and r["share"]["below_gpu_s"] == 3200.0 and r["share"]["ratio"] == 8.0
    assert resolved_params("tiresias") == {"thresholds": [57600.0], "starve_limit": None}
    assert resolved_params("tiresias-3200") == {"thresholds": [3200.0], "starve_limit": 4.0}
    assert resolved_params("fifo") == {}


@pytest.mark.parametrize("name,params,message", [
    ("nope", None, "unknown policy 'nope'; known: "),
    ("fifo", {"x": 1}, "policy 'fifo' takes no parameters"),
    ("trainyard", {"ordering": {"some_typo": 1}}, "no parameter 'ordering.some_typo'; known: reserve_at"),
    ("trainyard", {"ordering": 3}, "'ordering' is a group"),
    ("slurm", {"w_agee": 1}, "no parameter 'w_agee'; known: w_age, w_fairshare"),
])
def test_names_are_checked_where_policies_are_built(name, params, message):
    with pytest.raises(ValueError, match=re.escape(message)) as e:
        get_policy(name, params)
    if "unknown policy" in message:  # every known name, in registration order (which imports decide)
        assert sorted(str(e.value).split("known: ")[1].split(", ")) == sorted(policy_names())


# -- spec/models.py: the scheduler: section ---------------------------------------------------------------


def test_without_the_section_the_cluster_runs_todays_policy():
    cfg = parse_config(BASE)
    assert (cfg.scheduler.policy, cfg.scheduler.params) == ("trainyard", {})
    assert cfg.scheduler.build().params == EngineParams()
    assert parse_config(BASE + "scheduler: {}\n").scheduler.build().params == EngineParams()


def test_the_examples_commented_values_are_the_defaults():
    """Uncommenting every parameter of the example must change nothing."""
    text = EXAMPLE_CONFIG.read_text()
    at = text.index("scheduler:")
    assert load_config(EXAMPLE_CONFIG).scheduler.build().params == EngineParams()  # all commented out
    uncommented = text[:at] + re.sub(r"(?m)^(\s*)# (\s*\w+:)", r"\1\2", text[at:])
    spec = parse_config(uncommented).scheduler
    assert set(spec.params) == {p.name for p in policy_params("trainyard")}  # every one is listed
    assert spec.build().params == EngineParams()


def test_the_section_parses_into_the_policy_with_its_parameters():
    cfg = parse_config(BASE + "scheduler:\n  policy: trainyard\n  params:\n    max_reservations: 2\n"
                              "    reclaim_after_s: 5m\n    ordering:\n      reserve_at: 0.1\n      aging_weight: 1\n")
    assert cfg.scheduler.params == {"max_reservations": 2, "reclaim_after_s": 300.0,
                                    "ordering": {"reserve_at": 0.1, "aging_weight": 1.0}}
    assert cfg.scheduler.build().params == EngineParams(
        max_reservations=2, reclaim_after_s=300.0, ordering=OrderingParams(reserve_at=0.1, aging_weight=1.0))
    empty_group = parse_config(BASE + "scheduler:\n  params:\n    ordering:\n")  # all commented out below it
    assert empty_group.scheduler.build().params == EngineParams()
    t = parse_config(BASE + "scheduler:\n  policy: tiresias\n  params:\n    thresholds: [100, 1e4]\n"
                            "    starve_limit: 2\n").scheduler.build()
    assert isinstance(t, Tiresias) and t.thresholds == (100.0, 10000.0) and t.starve_limit == 2.0
    s = parse_config(BASE + "scheduler:\n  policy: slurm\n  params: {w_fairshare: 0, max_age_s: 1d}\n")
    assert s.scheduler.build().w_fairshare == 0.0 and s.scheduler.build().max_age_s == 86400.0
    assert parse_config(BASE + "scheduler:\n  policy: fifo\n").scheduler.build().name == "fifo"


@pytest.mark.parametrize("section,field,message", [
    ("scheduler:\n  policy: nope\n", "scheduler.policy", "unknown policy 'nope'; known: "),
    ("scheduler:\n  params:\n    max_reservatons: 2\n", "scheduler.params.max_reservatons",
     "policy 'trainyard' has no parameter 'max_reservatons'; known: ordering, backfill, preemption"),
    ("scheduler:\n  params:\n    ordering:\n      some_typo: 1\n", "scheduler.params.ordering.some_typo",
     "no parameter 'ordering.some_typo'; known: reserve_at, aging_weight, fairshare_weight, unknown_runtime_s, las_reserve_at"),
    ("scheduler:\n  policy: fifo\n  params:\n    reserve_at: 0.1\n", "scheduler.params.reserve_at",
     "policy 'fifo' takes no parameters"),
    ("scheduler:\n  params:\n    max_reservations: yes\n", "scheduler.params.max_reservations", "valid integer"),
    ("scheduler:\n  params:\n    max_reservations: 2.5\n", "scheduler.params.max_reservations", "valid integer"),
    ("scheduler:\n  params:\n    ordering:\n      reserve_at: -0.1\n", "scheduler.params.ordering.reserve_at",
     "greater than or equal to 0"),
    ("scheduler:\n  params:\n    ordering:\n      aging_weight: fast\n", "scheduler.params.ordering.aging_weight",
     "valid number"),
    ("scheduler:\n  params:\n    reclaim_after_s: soon\n", "scheduler.params.reclaim_after_s", "cannot read 'soon'"),
    ("scheduler:\n  params:\n    reclaim_share: .inf\n", "scheduler.params.reclaim_share", "finite number"),
    ("scheduler:\n  params:\n    ordering: 3\n", "scheduler.params.ordering",
     "a group of parameters: give a mapping of reserve_at"),
    ("scheduler:\n  params: [1, 2]\n", "scheduler.params", "valid dictionary"),
    ("scheduler:\n  policy: slurm\n  params:\n    max_age_s: 0\n", "scheduler.params.max_age_s", "greater than 0"),
    ("scheduler:\n  policy: tiresias\n  params:\n    thresholds: [100, lots]\n", "scheduler.params.thresholds.1",
     "valid number"),
    ("scheduler:\n  polcy: fifo\n", "scheduler.polcy", "Extra inputs"),
])
def test_a_bad_section_names_the_field_and_its_line(tmp_path, section, field, message):
    path = tmp_path / "cluster.yaml"
    path.write_text(BASE + section)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    err = e.value
    assert err.field == field and err.file == str(path)
    assert message in err.message
    if "unknown policy" in message:
        assert sorted(err.message.split("known: ")[1].split(", ")) == sorted(policy_names())
    # The line is the one holding the named key (or, for a list item, the list's line).
    named = field.split(".")[-1]
    line = path.read_text().splitlines()[err.line - 1]
    assert (named + ":") in line or (named.isdigit() and "[" in line), (err.line, line)
    assert f"{path}:{err.line}" in str(err)


# -- the nested groups of issue 36, and the flat names of before ---------------------------------


def test_the_nested_and_the_flat_spelling_build_the_same_policy():
    nested = parse_config(BASE + "scheduler:\n  params:\n    share:\n      below_gpu_s: null\n      ratio: 4\n"
                                 "    preemption: {reclaim_after_s: 5m}\n    moves: {for_gangs: false}\n").scheduler
    flat = parse_config(BASE + "scheduler:\n  params:\n    share_below_gpu_s: null\n    share_ratio: 4\n"
                               "    reclaim_after_s: 5m\n    move_for_gangs: false\n").scheduler
    want = EngineParams(share_below_gpu_s=None, share_ratio=4.0, reclaim_after_s=300.0, move_for_gangs=False)
    assert nested.build().params == flat.build().params == want
    assert want.share.below_gpu_s is None and want.preemption.reclaim_after_s == 300.0 and not want.moves.for_gangs
    assert nested.resolved() == flat.resolved() and flat.resolved()["share"]["ratio"] == 4.0
    assert nested.deprecations() == []
    assert sorted(flat.deprecations()) == sorted([
        "scheduler.params.share_below_gpu_s is deprecated; write it in its group: share: {below_gpu_s: ...}",
        "scheduler.params.share_ratio is deprecated; write it in its group: share: {ratio: ...}",
        "scheduler.params.reclaim_after_s is deprecated; write it in its group: preemption: {reclaim_after_s: ...}",
        "scheduler.params.move_for_gangs is deprecated; write it in its group: moves: {for_gangs: ...}"])


@pytest.mark.parametrize("section,field,message", [
    ("scheduler:\n  params:\n    share:\n      below_gpus: 1\n", "scheduler.params.share.below_gpus",
     "no parameter 'share.below_gpus'; known: below_gpu_s, above_gpu_s, max_lost_s, ratio, min_attempt_s"),
    ("scheduler:\n  params:\n    sharing: {ratio: 2}\n", "scheduler.params.sharing",
     "no parameter 'sharing'; known: ordering, backfill, preemption, share, las, overdue, moves"),
    ("scheduler:\n  params:\n    share_ratio: lots\n", "scheduler.params.share_ratio", "valid number"),
    ("scheduler:\n  params:\n    share_ratio: 2\n    share: {ratio: 3}\n", "scheduler.params",
     "'share_ratio' and 'share.ratio' are the same parameter"),
])
def test_a_bad_key_of_either_spelling_is_named(tmp_path, section, field, message):
    path = tmp_path / "cluster.yaml"
    path.write_text(BASE + section)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.field == field and message in e.value.message, (e.value.field, e.value.message)


def test_flat_names_still_build_and_read_in_python():
    p = EngineParams(max_preemptions_for=3, overdue_at=None, ordering=OrderingParams(reserve_at=0.2))
    assert p.preemption.max_preemptors == 3 and p.max_preemptions_for == 3 and p.overdue_at is None
    assert get_policy("trainyard", {"max_preemptions_for": 3, "overdue": {"at": None},
                                    "ordering": {"reserve_at": 0.2}}).params == p
    with pytest.raises(TypeError, match="max_preemption_for"):
        EngineParams(max_preemption_for=3)
    with pytest.raises(AttributeError, match="nope"):
        _ = p.nope
