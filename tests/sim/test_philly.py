"""The Philly loader on tiny hand-written CSVs: window, teams, quotas, shapes, and bad input."""

import pytest

from trainyard.sim.philly import largest_remainder, load_philly, parse_cluster_shape
from trainyard.spec.models import ConfigError

HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"
ROWS = [
    "2017-10-21 10:00:00,100.0,1,100.0,aaa",  # line 2
    "2017-10-20 00:00:05,3600.0,8,28800.0,bbb",  # line 3
    "2017-10-19 23:59:59,50.0,1,50.0,aaa",  # line 4: before --from
    "2017-10-22 00:00:00,7200.0,16,115200.0,zzz",  # line 5: VC not in the table
    "2017-10-20 00:00:05,60.0,2,120.0,aaa",  # line 6: same time as line 3
    "2017-10-23 00:00:00,10.0,1,10.0,aaa",  # line 7: on --to, excluded
]
VC = "vc,node num\naaa,3\nbbb,1\nccc,1\n"


def _write(tmp_path, rows=ROWS, header=HEADER, vc=VC):
    p = tmp_path / "trace.csv"
    p.write_text(header + "".join(r + "\n" for r in rows))
    (tmp_path / "philly_vc_nodes_heliosartifact.csv").write_text(vc)
    return p


def test_loads_window_sorted_with_ids_and_shapes(tmp_path):
    w = load_philly(_write(tmp_path), date_from="2017-10-20", date_to="2017-10-23", warmup_days=1, cluster="4x8")
    assert [j.req.id for j in w.jobs] == [2, 5, 1, 4]  # the data row: line - 1
    assert [j.label for j in w.jobs] == ["p00002", "p00005", "p00001", "p00004"]  # what estimates are seeded from
    assert [j.req.submit_time for j in w.jobs] == [5.0, 5.0, 34 * 3600.0, 2 * 86400.0]
    assert w.measure_from == 86400.0 and w.measure_to == 3 * 86400.0
    assert [w.measured(j.req.submit_time) for j in w.jobs] == [False, False, True, True]
    big = w.jobs[-1]
    assert big.req.gpus == 16 and big.req.gpus_per_node is None and big.duration_s == 7200.0
    assert all(j.req.job_class == "training" and j.req.checkpoint_interval_s == 1800.0 for j in w.jobs)
    assert all(j.req.est_runtime_s is None for j in w.jobs)
    assert set(w.classes) == {"interactive", "training", "batch"}
    assert len(w.nodes) == 4 and w.total_gpus == 32 and {n.gpu_mem_mib for n in w.nodes} == {24 * 1024}
    assert w.origin.isoformat() == "2017-10-20T00:00:00"
    assert w.notes


def test_quotas_from_vc_table(tmp_path):
    w = load_philly(_write(tmp_path), date_from="2017-10-20", date_to="2017-10-23", warmup_days=1, cluster="4x8")
    nominal = {t: team.quota("default").nominal for t, team in w.teams.items()}
    assert sum(nominal.values()) == 32
    assert nominal == {"aaa": 19, "bbb": 7, "ccc": 6, "zzz": 0}  # 3:1:1 of 32 = 19.2, 6.4, 6.4
    assert {t.cohort for t in w.teams.values()} == {"philly"}
    q = w.teams["zzz"].quota("default")
    assert q.borrowing_limit is None and q.lending_limit is None
    assert any("zzz" in n for n in w.notes)


def test_largest_remainder_sums_exactly():
    for total in (0, 1, 7, 640, 2816):
        shares = largest_remainder({"a": 64, "b": 32, "c": 16, "d": 8, "e": 8, "f": 3}, total)
        assert sum(shares.values()) == total
    assert largest_remainder({"a": 1, "b": 1}, 3) == {"a": 2, "b": 1}


def test_jobs_larger_than_cluster_are_left_out(tmp_path):
    w = load_philly(_write(tmp_path), date_from="2017-10-20", date_to="2017-10-23", warmup_days=0, cluster="1x8")
    assert all(j.req.gpus <= 8 for j in w.jobs) and len(w.jobs) == 3
    assert any("left out" in n for n in w.notes)


@pytest.mark.parametrize("bad_row, field", [
    ("2017-10-21 10:00:00,abc,1,100.0,aaa", "duration"),
    ("2017-10-21 10:00:00,-5,1,100.0,aaa", "duration"),
    ("2017-10-21 10:00:00,0,1,100.0,aaa", "duration"),
    ("2017-10-21 10:00:00,100.0,zero,100.0,aaa", "num_gpus"),
    ("2017-10-21 10:00:00,100.0,0,100.0,aaa", "num_gpus"),
    ("2017-10-21 10:00:00,100.0,1.5,100.0,aaa", "num_gpus"),
    ("2017-13-21 10:00:00,100.0,1,100.0,aaa", "timestamp"),
    ("yesterday,100.0,1,100.0,aaa", "timestamp"),
    ("2017-10-21 10:00:00,100.0,1,100.0,", "cluster"),
    ("2017-10-21 10:00:00,100.0,1,100.0", "cluster"),  # a value missing: names the first missing column
    ("2017-10-21 10:00:00,100.0,1,100.0,aaa,extra", None),
])
def test_malformed_row_names_file_line_field(tmp_path, bad_row, field):
    rows = ROWS[:3] + [bad_row] + ROWS[3:]  # the bad row is on line 5
    path = _write(tmp_path, rows)
    with pytest.raises(ConfigError) as e:
        load_philly(path, date_from="2017-10-20", date_to="2017-10-23", warmup_days=1)
    assert e.value.file == str(path) and e.value.line == 5 and e.value.field == field
    assert f"{path}:5" in str(e.value)


def test_bad_row_outside_window_is_still_an_error(tmp_path):
    path = _write(tmp_path, ROWS + ["2016-01-01 00:00:00,nan,1,1,aaa"])
    with pytest.raises(ConfigError) as e:
        load_philly(path, date_from="2017-10-20", date_to="2017-10-23", warmup_days=1)
    assert e.value.line == len(ROWS) + 2 and e.value.field == "duration"


def test_missing_header_column(tmp_path):
    path = _write(tmp_path, header="timestamp,duration,gpu_time,cluster\n",
                  rows=["2017-10-21 10:00:00,100.0,100.0,aaa"])
    with pytest.raises(ConfigError) as e:
        load_philly(path, date_from="2017-10-20", date_to="2017-10-23")
    assert e.value.line == 1 and e.value.field == "num_gpus"


def test_bad_vc_table(tmp_path):
    path = _write(tmp_path, vc="vc,node num\naaa,three\n")
    with pytest.raises(ConfigError) as e:
        load_philly(path, date_from="2017-10-20", date_to="2017-10-23")
    assert e.value.line == 2 and e.value.field == "node num" and e.value.file.endswith("heliosartifact.csv")


def test_bad_window(tmp_path):
    path = _write(tmp_path)
    with pytest.raises(ConfigError, match="after"):
        load_philly(path, date_from="2017-10-22", date_to="2017-10-20")
    with pytest.raises(ConfigError) as e:
        load_philly(path, date_from="2017-10-20", date_to="2017-10-22", warmup_days=2)
    assert e.value.field == "warmup_days"
    with pytest.raises(ConfigError) as e:
        load_philly(path, date_from="20/10/2017", date_to="2017-10-22")
    assert e.value.field == "from"


def test_parse_cluster_shape():
    assert parse_cluster_shape("80x8") == (80, 8)
    assert parse_cluster_shape(" 352X8 ") == (352, 8)
    for bad in ("80", "80x", "x8", "0x8", "80x0", "eightyx8", "80*8"):
        with pytest.raises(ConfigError) as e:
            parse_cluster_shape(bad)
        assert e.value.field == "cluster"
