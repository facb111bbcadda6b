#!/usr/bin/env bash
# The prepared GPU check (issue 19 part 7): ≤ 8 minutes on one GPU, from a copy of the working tree.
#
#   bash bench/gpu_check.sh [--out DIR] [--dry-run] [--wheels DIR] [--python PY] [--budget-s N] [-- ARGS…]
#   bash bench/gpu_check.sh --fetch-wheels DIR     # on a machine with a package index: the wheels below
#
# What it does (the stages themselves: bench/gpu_check.py; its `nvml` stage also reads every GPU
# through the node agent's NVML source, backends/local/gpu_agent.py, issue 39):
# 1. picks the interpreter: --python, else $GPU_CHECK_PYTHON, else python3 (on a GPU machine, the
#    one that holds a CUDA build of PyTorch; nothing is built or downloaded here);
# 2. puts this checkout first on PYTHONPATH (src/ and the repo root), so the repo's code runs
#    without being installed;
# 3. installs what that interpreter lacks of the packages trainyard needs beyond PyTorch,
#    transformers and nvidia-ml-py, from the wheels in --wheels DIR (default: .whl/ in the repo,
#    when there), offline, into a directory of its own (`pip install --no-index --no-deps
#    --target`), never into the interpreter's own site-packages. The wheels it names (for
#    Python 3.12, x86-64, as `--fetch-wheels` downloads them):
#        pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
#        typing_extensions==4.16.0
#    (torch, transformers, safetensors, tokenizers, numpy, pyyaml, typer, rich, nvidia-ml-py are
#    expected to be there already; put wheels of them in DIR too where they are not);
# 4. runs `gpu_check.py --out DIR` under `timeout` (budget + 20 s): every stage pass/fail/skip,
#    gpu_check.json/.md/.log in --out (default $OUT, else ./gpu-check-out).
# Without a CUDA device every GPU stage is skipped ("skipped: no CUDA device") and the exit code is
# 0; --dry-run validates the stages' recipes and arithmetic and runs none. Exit: 0 no stage failed,
# 1 a stage failed, 2 bad arguments or a missing package, 124 the time box ran out.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
WHEELS_NAMED=(pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
              typing_extensions==4.16.0)

usage() { sed -n '2,5p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
die() { echo "error: $*" >&2; exit 2; }

OUT_DIR="${OUT:-$PWD/gpu-check-out}"
PY="${GPU_CHECK_PYTHON:-}"
WHEELS=""
FETCH=""
BUDGET=450
DRY=()
PASS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) [ $# -ge 2 ] || die "--out: needs a directory"; OUT_DIR="$2"; shift 2 ;;
    --python) [ $# -ge 2 ] || die "--python: needs an interpreter"; PY="$2"; shift 2 ;;
    --wheels) [ $# -ge 2 ] || die "--wheels: needs a directory"; WHEELS="$2"; shift 2 ;;
    --fetch-wheels) [ $# -ge 2 ] || die "--fetch-wheels: needs a directory"; FETCH="$2"; shift 2 ;;
    --budget-s) [ $# -ge 2 ] || die "--budget-s: needs seconds"; BUDGET="$2"; shift 2 ;;
    --dry-run) DRY=(--dry-run); shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; PASS+=("$@"); break ;;
    *) die "unknown argument '$1' (see --help; gpu_check.py's own options go after --)" ;;
  esac
done
case "$BUDGET" in ''|*[!0-9]*) die "--budget-s: a whole number of seconds, got '$BUDGET'" ;; esac
[ -n "$PY" ] || PY="$(command -v python3 || true)"
[ -n "$PY" ] && "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
  || die "no Python 3.11+ interpreter (give --python or GPU_CHECK_PYTHON)"

if [ -n "$FETCH" ]; then
  mkdir -p "$FETCH" || die "--fetch-wheels: cannot create $FETCH"
  exec "$PY" -m pip download --no-deps --only-binary=:all: --python-version "${GPU_CHECK_PYVER:-3.12}" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$FETCH" "${WHEELS_NAMED[@]}"
fi

mkdir -p "$OUT_DIR" || die "--out: cannot create $OUT_DIR"
export PYTHONPATH="$REPO/src:$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

missing() { "$PY" - "$@" <<'EOF'
import importlib.util, sys
print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))
EOF
}
NEED=(pydantic yaml typer rich numpy)
LACK="$(missing "${NEED[@]}")"
if [ -n "$LACK" ]; then
  [ -n "$WHEELS" ] || { [ -d "$REPO/.whl" ] && WHEELS="$REPO/.whl"; }
  [ -n "$WHEELS" ] || die "the interpreter $PY lacks: $LACK; give --wheels DIR (bench/gpu_check.sh --fetch-wheels DIR downloads them where an index is reachable)"
  SITE="${GPU_CHECK_SITE:-${TMPDIR:-/tmp}/gpu-check-site}"
  echo "gpu_check.sh: $PY lacks $LACK; installing the wheels of $WHEELS into $SITE (offline)"
  timeout 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$WHEELS"/*.whl || die "pip could not install the wheels of $WHEELS"
  export PYTHONPATH="$SITE:$PYTHONPATH"
  LACK="$(missing "${NEED[@]}")"
  [ -z "$LACK" ] || die "still missing after installing $WHEELS: $LACK"
fi

echo "gpu_check.sh: $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])'); repo $REPO; out $OUT_DIR"
timeout -k 10 "$((BUDGET + 20))" "$PY" "$HERE/gpu_check.py" --out "$OUT_DIR" --budget-s "$BUDGET" \
  ${DRY[@]+"${DRY[@]}"} ${PASS[@]+"${PASS[@]}"}
rc=$?
[ "$rc" -eq 124 ] && echo "gpu_check.sh: the time box of $((BUDGET + 20)) s ran out" >&2
exit "$rc"
