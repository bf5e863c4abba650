#!/usr/bin/env bash
# On a GPU host with torch, triton and nvcc: build the CUDA extension in place, then run the GPU
# tests, the pre-publish suites, the benchmarks, the GDN accuracy check and the >2^31-element
# check. A debugging shortcut: releases test the wheel built in the builder image instead (nox -s gate).
#   [STEPS="tests suites bench accuracy large-index"] scripts/gpu-host-check.sh OUT_DIR [pytest args...]
# STEPS picks which of them run (all by default); each has its own timeout (*_TIMEOUT, seconds);
# BENCH_ARGS goes to the benchmarks (e.g. "--only gdn --case T32768"), ACCURACY_ARGS to the GDN
# accuracy check (e.g. "--case H2/8"). With AB_BASE set (a git revision, or a folder holding that
# revision's tree), step "ab" runs first: the GDN A/B of the working tree against it
# (python -m benchmarks.ab_rounds; AB_ARGS e.g. "--rounds 3 --case T32768"). The GDN GPU tests take
# minutes one by one: with pytest-xdist, pass "-p no:benchmark -n 4" (pytest-benchmark refuses to run
# beside xdist).
set -uo pipefail
out=${1:-build/gpu-check}
shift || true
mkdir -p "$out"
export PYTHONUNBUFFERED=1
steps=" ${STEPS:-${AB_BASE:+ab }tests suites bench accuracy large-index} "
step() { echo "== $1 ($(date -u +%H:%M:%S))"; }
wanted() { [[ $steps == *" $1 "* ]]; }

step "build the CUDA extension (TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0})"
POLYKERNELS_BACKEND=cuda TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} \
  python3 setup.py -q build_ext --inplace >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
# A C++ check's exception must reach Python as an error. Some toolchains (CC/CXX) build an extension
# whose exceptions kill the process instead; every test of a bad input would then crash its worker.
if ! python3 -c "import sys, torch, polykernels._extension as e; e.require()
try: torch.ops.polykernels.fake_int4_quant(torch.zeros(1, 64), 33, True)
except RuntimeError: sys.exit(0)
sys.exit(1)" >>"$out/build.log" 2>&1; then
  echo "the extension built with CXX=${CXX:-c++} does not raise its checks' errors (it crashed or accepted a" \
       "group size of 33): rebuild with another C++ compiler, e.g. CC=gcc CXX=g++ from the system's PATH" >&2
  exit 1
fi

if wanted ab; then
  step "A/B against ${AB_BASE:?set AB_BASE to the git revision to compare with}"
  timeout "${AB_TIMEOUT:-600}" python3 -m benchmarks.ab_rounds "$AB_BASE" --out "$out/ab" ${AB_ARGS:-} 2>&1 \
    | tee "$out/ab.log" | tail -20
fi

if wanted tests; then
  step "GPU tests"
  timeout "${TEST_TIMEOUT:-300}" python3 -m pytest tests/unit -m "gpu and not slow" --run-gpu -q -rfE \
    -p no:cacheprovider --durations=5 "$@" 2>&1 | tee "$out/pytest.log" | grep -vE '^\s*$' | tail -25
fi

if wanted suites; then
  step "suites"
  timeout "${SUITES_TIMEOUT:-200}" python3 -m polykernels.suites --report "$out/suites.json" 2>&1 \
    | tee "$out/suites.log"
fi

if wanted bench; then
  step "benchmarks"
  # What `nox -s bench` runs, without needing nox on the GPU host.
  timeout "${BENCH_TIMEOUT:-360}" python3 -m benchmarks.run --out "$out" ${BENCH_ARGS:-} 2>&1 \
    | tee "$out/bench.log" | tail -40
fi

if wanted accuracy; then
  step "GDN accuracy against the fp64 recurrence (ours and FLA)"
  timeout "${ACCURACY_TIMEOUT:-240}" python3 -m benchmarks.gdn_accuracy "${ACCURACY_MAX_TOKENS:-65536}" \
    ${ACCURACY_ARGS:-} | tee "$out/gdn_accuracy.jsonl"
fi

if wanted large-index; then
  step "large-index check (state buffer past 2^31 elements)"
  timeout "${LARGE_TIMEOUT:-120}" python3 -m benchmarks.gdn_large_index | tee "$out/large_index.json"
fi
step "done"
