"""The local backend's datasets (backends/local/backend.py, staging/cache.py): each emulated node has
a cache of its own under `<data_dir>/datasets/<node>`, every rank (and every task a batch script's
srun starts) finds `$TRAINYARD_DATASET_<NAME>` on its own node, and `release` unpins the attempt's
entries so that they may be evicted."""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from trainyard.staging.cache import NodeDatasetCache
from trainyard.staging.types import DatasetRef, SourceAccess, dataset_var

from tests.backends.helpers import make_spec, wait_done
from tests.backends.local.test_local_batch import batch, json_lines, log

pytest.importorskip("trainyard.staging.source")  # the catalogue's copier (staging/source.py)

PY = sys.executable
TWO_NODES = ((0, "node0", (0,)), (1, "node1", (0,)))
VAR = dataset_var("corpus")
SHOW = ("import json, os; print(json.dumps({'node': os.environ.get('SLURMD_NODENAME') or os.environ['TRAINYARD_NODE'], "
        f"'path': os.environ['{VAR}']}}))")


def _ref(tmp_path: Path) -> DatasetRef:
    src = tmp_path / "corpus.jsonl"
    src.write_text('{"text": "a"}\n' * 100)
    return DatasetRef("corpus", "v1", str(src), "sha256:" + hashlib.sha256(src.read_bytes()).hexdigest(),
                      src.stat().st_size)


def _staged(backend, ref: DatasetRef, job: tuple[int, int]) -> dict[str, dict[str, str]]:  # noqa: ANN001
    out = {}
    for node in ("node0", "node1"):
        got = backend.stage_dataset(node, ref, SourceAccess(), job)
        out[node] = {VAR: got.path}
    return out


def test_each_node_has_its_own_cache_and_each_rank_its_own_nodes_copy(backend, tmp_path):
    ref = _ref(tmp_path)
    paths = _staged(backend, ref, (1, 1))
    assert paths["node0"][VAR] == str(NodeDatasetCache(tmp_path / "datasets" / "node0").path_of(ref.checksum))
    assert paths["node0"][VAR] != paths["node1"][VAR]
    spec = replace(make_spec(tmp_path, 1, [PY, "-c", SHOW], ranks=TWO_NODES), datasets=(ref,), dataset_paths=paths)
    backend.launch(spec)
    wait_done(backend, 1, timeout=30)
    for rank, node in ((0, "node0"), (1, "node1")):
        [line] = json_lines(log(tmp_path, 1, rank))
        assert line == {"node": node, "path": paths[node][VAR]}
    assert [e.in_use for e in backend.dataset_entries("node0")] == [True]
    backend.release(1, 1)
    assert [e.in_use for e in backend.dataset_entries("node0")] == [False]
    assert backend.remove_dataset("node0", ref.checksum) and backend.dataset_entries("node0") == []
    assert len(backend.dataset_entries("node1")) == 1


def test_a_batch_scripts_tasks_find_their_own_nodes_copy(backend, tmp_path):
    ref = _ref(tmp_path)
    paths = _staged(backend, ref, (2, 1))
    (tmp_path / "show.py").write_text(SHOW)
    spec = replace(batch(tmp_path, 2, f"srun {PY} {tmp_path / 'show.py'}\n", ranks=TWO_NODES), datasets=(ref,),
                   dataset_paths=paths)
    backend.launch(spec)
    wait_done(backend, 2, timeout=30)
    lines = sorted(json.dumps(x, sort_keys=True) for x in json_lines(log(tmp_path, 2, 0)))
    assert lines == sorted(json.dumps({"node": n, "path": paths[n][VAR]}, sort_keys=True) for n in ("node0", "node1"))
