"""Configuration models: the example loads, and bad input names the file, line and field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from trainyard.spec.models import (EXAMPLE_CONFIG, ClusterSpec, ConfigError, JobSpec, load_config, load_jobs, parse_duration,
                            parse_node_range)


def test_example_config_has_the_three_classes():
    cfg = load_config(EXAMPLE_CONFIG)
    nodes, teams, classes = cfg.to_sched()
    assert set(classes) == {"interactive", "training", "batch"}
    assert classes["interactive"].preemptible is False
    assert classes["training"].min_run_s == 600 and classes["training"].max_wait_s == 86400
    assert len(nodes) == 8 and {n.block for n in nodes} == {"b0", "b1"}
    assert teams["product"].quota("default").lending_limit == 16
    assert cfg.default_class == "training"


@pytest.mark.parametrize("text,value", [(90, 90.0), ("30m", 1800.0), ("2h", 7200.0), ("1d", 86400.0),
                                        ("1-12:00:00", 129600.0), ("01:30:00", 5400.0), ("1:30", 90.0), ("2-6", 194400.0), ("2-6:30", 196200.0)])
def test_durations(text, value):
    assert parse_duration(text) == value


def test_bad_duration_says_why():
    with pytest.raises(ValueError, match="duration"):
        parse_duration("soon")


def test_node_ranges():
    assert parse_node_range("2-4") == (2, 4)
    assert parse_node_range(3) == (3, 3)
    for bad in ("4-2", "0", "x"):
        with pytest.raises(ValueError):
            parse_node_range(bad)


def write(tmp_path, text):
    p = tmp_path / "cluster.yaml"
    p.write_text(text)
    return p


def test_unknown_field_is_named_with_its_line(tmp_path):
    text = EXAMPLE_CONFIG.read_text().replace("    priority: 200\n", "    priority: 200\n    priorty: 3\n")
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_config(p)
    err = e.value
    assert err.file == str(p) and err.field == "classes.1.priorty"
    assert p.read_text().splitlines()[err.line - 1].strip() == "priorty: 3"
    assert str(p) in str(err) and "priorty" in str(err)


def test_wrong_type_is_named(tmp_path):
    p = write(tmp_path, EXAMPLE_CONFIG.read_text().replace("gpus: 8, gpu_model: H100, gpu_mem_gb: 80, block: b1, rack: r3",
                                                           "gpus: -8, gpu_model: H100, gpu_mem_gb: 80, block: b1, rack: r3"))
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert e.value.field == "cluster.nodes.3.gpus" and e.value.line is not None


def test_malformed_yaml_gives_the_line(tmp_path):
    p = write(tmp_path, "cluster:\n  nodes: [\n teams: x\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert e.value.line is not None and "YAML" in str(e.value)


def test_reference_errors(tmp_path):
    text = EXAMPLE_CONFIG.read_text().replace("default_class: training", "default_class: urgent")
    with pytest.raises(ConfigError, match="urgent"):
        load_config(write(tmp_path, text))
    text = EXAMPLE_CONFIG.read_text().replace("default: {nominal: 40", "gpu-pool: {nominal: 40")
    with pytest.raises(ConfigError, match="unknown pool"):
        load_config(write(tmp_path, text))


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.yaml")


def test_jobs_file_and_shapes(tmp_path):
    p = tmp_path / "jobs.yaml"
    p.write_text("jobs:\n  - {team: a, gpus: 4}\n  - {team: a, nodes: 2-4, gpus_per_node: 8, class: batch}\n"
                 "  - {team: a, nodes: 4-2, gpus_per_node: 8}\n")
    with pytest.raises(ConfigError) as e:
        load_jobs(p)
    assert e.value.line == 4 and e.value.field == "jobs.2.nodes"  # the third job: a backwards range
    p.write_text("- {team: a, gpus: 4, runtime_estimate: 2h}\n- {team: a, nodes: 2-4, gpus_per_node: 8, class: batch}\n")
    one, two = load_jobs(p)
    r = two.to_request(2)
    assert (r.min_nodes, r.max_nodes, r.gpus_per_node, r.job_class, r.elastic) == (2, 4, 8, "batch", True)
    assert one.to_request(1).est_runtime_s == 7200.0 and one.to_request(1).id == 1


def test_a_job_needs_a_size():
    with pytest.raises(ValidationError, match="give either gpus"):
        JobSpec.model_validate({"team": "a"})


def test_gpu_memory_in_gb_becomes_the_engines_mib_once():
    """Configs and job files write GB; the engine's nodes and requests hold MiB, `round(gb * 1024)`."""
    cluster = ClusterSpec.model_validate({"nodes": [{"name": "a", "gpus": 8, "gpu_mem_gb": 80},
                                                    {"name": "b", "count": 2, "gpus": 1, "gpu_mem_gb": 0.5},
                                                    {"name": "c", "gpus": 1, "gpu_mem_gb": 23.9}]})
    assert [(n.name, n.gpu_mem_mib) for n in cluster.expand()] == [("a", 81920), ("b-0", 512), ("b-1", 512),
                                                                   ("c", 24474)]
    for gb, mib in ((0.5, 512), (1.001, 1025), (80, 81920)):
        for shape in ({"gpus": 1}, {"nodes": 1, "gpus_per_node": 1}):
            r = JobSpec.model_validate({"team": "a", "gpu_mem_gb": gb, **shape}).to_request(7)
            assert r.gpu_mem_mib == mib and type(r.gpu_mem_mib) is int
    assert JobSpec.model_validate({"team": "a", "gpus": 1}).to_request(7).gpu_mem_mib is None
    assert {n.gpu_mem_mib for n in load_config(EXAMPLE_CONFIG).to_sched()[0]} == {81920}


def test_pool_aliases_name_pools_once():
    """cluster.pools gives a pool other names for -p (issue 35): each alias means one pool, never
    another pool's own name, and only pools some node is in."""
    nodes = [{"name": "n", "gpus": 4, "pool": "default"}, {"name": "m", "gpus": 4, "pool": "big"}]
    c = ClusterSpec(nodes=nodes, pools=[{"name": "default", "aliases": ["train", "gpu"]}])
    assert c.pool_names() == {"default": "default", "big": "big", "train": "default", "gpu": "default"}
    with pytest.raises(ValidationError, match="alias 'big' already names pool 'big'"):
        ClusterSpec(nodes=nodes, pools=[{"name": "default", "aliases": ["big"]}])
    with pytest.raises(ValidationError, match="alias 'x' already names pool 'default'"):
        ClusterSpec(nodes=nodes, pools=[{"name": "default", "aliases": ["x"]}, {"name": "big", "aliases": ["x"]}])
    with pytest.raises(ValidationError, match="no node is in pool 'gone'"):
        ClusterSpec(nodes=nodes, pools=[{"name": "gone", "aliases": ["x"]}])
