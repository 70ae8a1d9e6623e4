#!/bin/sh
# The KV-dtype study (issue 14): each KV cache dtype (auto = bf16, fp8_e5m2, fp8_e4m3; DTYPES="auto int8" for edgectl's
# int8) in a fresh process per pass, interleaved.
# usage: sh scripts/study/kv_dtype_study.sh OUTDIR PASSES [VAR=VALUE ...]   (e.g. ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2)
OUT=$1; PASSES=$2; shift 2
mkdir -p $OUT
o=0
for p in $(seq 1 $PASSES); do
  for dt in ${DTYPES:-auto fp8_e5m2 fp8_e4m3}; do
    env -i PATH=/usr/bin:/bin HOME=/root OMP_NUM_THREADS=2 VLLM_CPU_OMP_THREADS_BIND=0-1 VLLM_ENABLE_V1_MULTIPROCESSING=0 \
      EDGECTL_ROPE_CAP=1 EDGECTL_INT4_GROUP_SIZE=32 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
      PYTHONPATH="$(dirname "$0")/../..:$(dirname "$0")/../../runtime" "$@" \
      /opt/edgectl/venv/bin/python "$(dirname "$0")/kv_dtype_one.py" $dt $o $OUT/$dt-p$p.json > $OUT/$dt-p$p.log 2>&1
    echo "$dt p$p rc=$? $(tail -1 $OUT/$dt-p$p.log | cut -c1-400)"
    o=$((o+1))
  done
done
