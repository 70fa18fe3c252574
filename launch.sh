#!/usr/bin/env bash
# transformer_jax: the one entry point.
#
#   ./launch.sh                          set up if needed, train experiments/default.py into
#                                        ./workdir/default, average its last checkpoints and
#                                        eval them: prints the test BLEU
#   ./launch.sh train [FLAGS...]         train (or resume) with python -m transformer_jax.main
#   ./launch.sh MODE [FLAGS...]          any other --mode of transformer_jax.main: average,
#                                        eval, translate (--input=FILE --output=FILE), or
#                                        several in one process: train,average,eval
#   ./launch.sh compile --target=v5e-8 [FLAGS...]
#                                        compile every program of the experiment for a TPU slice
#                                        or GPU machine (v5e-8, v5p-128, 8xh100, ...) on this CPU:
#                                        per-device memory, cost, fit (needs the tpu or cuda
#                                        extra: .venv/bin/pip install -e '.[tpu,cuda]')
#   ./launch.sh kernels --config=FILE[:VARIANT] [--target=1xh100] [--change=TEXT]
#                                        the train step compiled for a GPU on this CPU: kernels,
#                                        HBM bytes and roofline floor read off its optimized HLO,
#                                        as a row of docs/performance.md's table (estimates;
#                                        python -m tools.kernel_row)
#   ./launch.sh inspect --workdir=DIR [--verify]
#                                        list a work directory's checkpoints; --verify reads each
#                                        back and checks it (python -m
#                                        transformer_jax.cli.inspect_checkpoints)
#   ./launch.sh import --marian=DIR --workdir=DIR
#                                        convert a Marian (OPUS-MT) model into a work directory
#                                        (python -m transformer_jax.pretrained import)
#   ./launch.sh export --config=FILE --workdir=DIR --output=DIR
#                                        write a work directory's model as a Marian directory
#   ./launch.sh test [PYTEST_ARGS...]    run the test suite on the CPU in $TJ_TEST_WORKERS (default 2)
#                                        processes; -m "not slow": the fast tier (the checks
#                                        against Hugging Face's Marian model need: .venv/bin/pip
#                                        install -e '.[hf]'; without it they are skipped)
#   ./launch.sh lint                     ruff's lint and format checks over the tree (CI runs them
#                                        before the tests); ./launch.sh lint --fix rewrites instead
#   ./launch.sh bench [FLAGS...]         python -m tools.benchmark (--config=small|base|big,
#                                        --vs=torch needs: .venv/bin/pip install -e '.[bench]')
#   ./launch.sh device-bundle DIR        download here the wheels a GPU machine's image lacks
#                                        (CPython 3.12, Linux x86-64) into DIR (docs/gpu.md)
#   ./launch.sh device-report --out=DIR [--bundle=DIR] [--deadline=375]
#                                        measure the project on this machine's accelerator: every
#                                        stage's JSON and report.md in DIR (docs/gpu.md); with
#                                        --bundle, the machine's own python3 (no set-up, no network)
#   ./launch.sh setup                    only create/refresh the virtual environment
#
# bench, kernels, device-bundle and device-report run the lab tools in ./tools (python -m
# tools.<name> from this directory): they sit beside the package and are not installed with it.
#
# FLAGS are transformer_jax.main's: --config=experiments/wmt14.py:base,
# --config.<field>=<value>, --workdir=DIR (default: ./workdir/<config>[_<variant>]),
# --distributed=auto|on|off, --coordinator_address, --num_processes, --process_id.
#
# Several hosts: start the same command once per host.
#   TPU VM pod slice:  gcloud compute tpus tpu-vm ssh NAME --worker=all \
#                        --command="cd transformer_jax && ./launch.sh train --distributed=on ..."
#   SLURM:             srun --nodes=N --ntasks-per-node=1 ./launch.sh train ...
#                      (jax.distributed.initialize() reads SLURM's environment)
# The work directory must be shared by all hosts (a network file system or gs://).
#
# Set-up happens on first use: a virtual environment in $TJ_VENV (default
# ./.venv) with the package and its test extra installed. It is refreshed when
# pyproject.toml changes. Any failure exits non-zero.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"
VENV="${TJ_VENV:-.venv}"
# Large buffers (activations, gradients, logits) come from malloc as fresh
# mappings every step; transparent huge pages (glibc >= 2.35, THP set to
# madvise or always) make their page faults up to 512x fewer. On 2 CPU cores
# this makes a train step 7-12% faster.
export GLIBC_TUNABLES="${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}glibc.malloc.hugetlb=1"
PY="$VENV/bin/python"

setup() {
  local stamp="$VENV/.transformer_jax-installed"
  local want
  want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
  if [[ -x "$PY" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    return 0
  fi
  echo "launch.sh: setting up $VENV (one time; a few minutes)" >&2
  [[ -x "$PY" ]] || python3 -m venv "$VENV"
  "$PY" -m pip install --quiet --upgrade pip
  "$PY" -m pip install --quiet -e ".[test]"
  echo "$want" > "$stamp"
}

# python -m transformer_jax.main --mode=$1 with the remaining flags, adding
# --config=experiments/default.py and --workdir=./workdir/<config name> when absent.
run_main() {
  local mode="$1"
  shift
  local config="" workdir=""
  for arg in "$@"; do
    case "$arg" in
      --config=*) config="${arg#--config=}" ;;
      --workdir=*) workdir="${arg#--workdir=}" ;;
      --config|--workdir)
        echo "launch.sh: write $arg=VALUE (with '=')" >&2
        exit 2
        ;;
    esac
  done
  local extra=()
  if [[ -z "$config" ]]; then
    config="experiments/default.py"
    extra+=("--config=$config")
  fi
  if [[ -z "$workdir" ]]; then
    local name
    name="$(basename "${config%%:*}" .py)"
    [[ "$config" == *:* ]] && name="${name}_${config#*:}"
    extra+=("--workdir=workdir/$name")
  fi
  exec "$PY" -m transformer_jax.main --mode="$mode" "${extra[@]}" "$@"
}

mode="${1:-default}"
[[ $# -gt 0 ]] && shift
case "$mode" in
  default)
    setup
    # One process for the three modes: Python, JAX and the data start once.
    (run_main train,average,eval --checkpoint=averaged)
    echo "launch.sh: $SECONDS s in all" >&2
    ;;
  setup) setup ;;
  test)
    setup
    # Two worker processes, each taking whole test files (their module fixtures are made once)
    # in the order tests/conftest.py gives, the longest first; arguments after these win (-n 0:
    # one process).
    exec "$PY" -m pytest -q -n "${TJ_TEST_WORKERS:-2}" --dist=loadfile --no-loadscope-reorder "$@"
    ;;
  lint)
    setup
    "$PY" -m ruff --version > /dev/null 2>&1 || "$PY" -m pip install --quiet -e ".[lint]"
    if [[ "${1:-}" == "--fix" ]]; then
      "$PY" -m ruff check --fix .
      exec "$PY" -m ruff format .
    fi
    "$PY" -m ruff check .
    exec "$PY" -m ruff format --check .
    ;;
  bench)
    setup
    exec "$PY" -m tools.benchmark "$@"
    ;;
  device-bundle)
    setup
    exec "$PY" -m tools.device_report.bundle "$@"
    ;;
  device-report)
    # A GPU machine without network has no venv to make: the bundle brings what it lacks.
    for arg in "$@"; do
      [[ "$arg" == --bundle=* || "$arg" == --bundle ]] && exec "${TJ_PYTHON:-python3}" -m tools.device_report "$@"
    done
    setup
    exec "$PY" -m tools.device_report "$@"
    ;;
  inspect)
    setup
    exec "$PY" -m transformer_jax.cli.inspect_checkpoints "$@"
    ;;
  kernels)
    setup
    exec "$PY" -m tools.kernel_row "$@"
    ;;
  import|export)
    setup
    exec "$PY" -m transformer_jax.pretrained "$mode" "$@"
    ;;
  -h|--help|help)
    awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"
    ;;
  -*)
    echo "launch.sh: the mode comes first: ./launch.sh train $mode ... (try: ./launch.sh help)" >&2
    exit 2
    ;;
  *)
    setup
    run_main "$mode" "$@"
    ;;
esac
