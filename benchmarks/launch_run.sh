#!/usr/bin/env bash
# The eager cost table before and after, on one card in one run, then this tree's GPU tests of fast_launch;
# the comparison tables print last. Needs the baseline tree unpacked at .base/ (e.g. `git archive 27893e6 |
# tar -x -C .base`) and $OUT (JSON and logs go there). About 7 minutes on an H100.
#
# Interleaved: a discarded warm-up run, then before, after, before, after per mode. The first measuring
# process of a call read hosts 1.2-2.2x slow on the H100s (docs/benchmarks.md, "Eager cost before and
# after"), and hosts drift by tens of per cent within a call: a single before-then-after run credits the
# tree measured second. Each pass prints its own table; a change is what both passes show.
set -u
OUT=${OUT:-/tmp/launch-run}
mkdir -p "$OUT"
PY=${PYTHON:-python}
BENCH="$PY benchmarks/launch_bench.py"
MEASURE_ARGS=${MEASURE_ARGS:-}  # e.g. "--preset tiny --layouts 1x64 --repeats 1" for a CPU smoke run
ROCM="ROCM_VIT_EMULATE=rocm SGLANG_USE_AITER=1"
step() {  # step NAME TIMEOUT_S "ENV=... COMMAND": output to $OUT/NAME.log, its tail here; keeps going on failure
  echo "== $1" >&2
  timeout "$2" bash -c "$3" >"$OUT/$1.log" 2>&1 || echo "   $1 failed (exit $?): see $OUT/$1.log" >&2
  tail -n 9 "$OUT/$1.log" >&2
}
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >&2 || true
step warm-up 60 "PYTHONPATH=. $BENCH measure --layouts 1x224,1x736 $MEASURE_ARGS --label warm-up --out $OUT/warm-up.json"
for pass in 1 2; do
  step before-native-$pass 95 "PYTHONPATH=.base $BENCH measure $MEASURE_ARGS --label before --out $OUT/before-native-$pass.json"
  step after-native-$pass 95 "PYTHONPATH=. $BENCH measure $MEASURE_ARGS --label after --out $OUT/after-native-$pass.json"
done
for pass in 1 2; do
  step before-rocm-$pass 110 "PYTHONPATH=.base $ROCM $BENCH measure $MEASURE_ARGS --label before --out $OUT/before-rocm-$pass.json"
  step after-rocm-$pass 110 "PYTHONPATH=. $ROCM $BENCH measure $MEASURE_ARGS --label after --out $OUT/after-rocm-$pass.json"
done
step after-native-slow 60 "PYTHONPATH=. $BENCH measure --layouts 1x224,1x736,1x1440 $MEASURE_ARGS --label after --slow-launches \
  --out $OUT/after-native-slow.json"
step launches 60 "PYTHONPATH=. $BENCH launches --out $OUT/launches.json"
step gpu-tests 70 "PYTHONPATH=. $PY -m pytest -q -x -m gpu tests/gpu/test_fast_launch_gpu.py"
echo "== launch floors (host us per call, this tree)"
cat "$OUT/launches.log"
for pass in 1 2; do
  echo "== comparison, pass $pass"
  $BENCH compare "$OUT"/{before,after}-native-$pass.json "$OUT"/{before,after}-rocm-$pass.json 2>&1 | tee "$OUT/comparison-$pass.txt"
done
echo "== fast_launch off (after, pass 2 against after-native-slow)"
$BENCH compare "$OUT"/after-native-2.json "$OUT"/after-native-slow.json 2>&1 | tee "$OUT/comparison-slow.txt"
