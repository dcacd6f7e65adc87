# Sourced by the device scripts: $OUT, the carried wheels installed once per machine into
# /tmp/site (runs on the GPUs of one machine share it), unbuffered Python, NVLink multicast off.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if [ ! -d /tmp/site ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
fi
export SITE=/tmp/site PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
