#!/usr/bin/env bash
# Checks the node agent's real NVML path on a machine with an NVIDIA GPU and driver
# (docs/nodeagent.md, "Tests"). Build here first, then run this there:
#
#   go test -c -tags nvml -o .devbin/gpu.test ./nodeagent/gpu
#   go test -c -tags nvml -o .devbin/runtime.test ./nodeagent/runtime
#   go build -ldflags '-s -w' -o .devbin/gantry-nodeagent ./nodeagent/cmd/gantry-nodeagent
#   scripts/device-nvml-check.sh .devbin OUTDIR
#
# It runs the nvml-tagged tests, the linux-user runtime cycle as root, and `gantry-nodeagent
# gpu` idle and again while a CUDA program (PyTorch, where the machine has it) keeps the
# GPU busy, so the sample shows the load NVML reports.
set -u
bin=${1:-.devbin}
out=${2:-/tmp/nvml-check}
mkdir -p "$out"
rc=0
step() { echo; echo "== $*"; }
step "nvidia-smi"
nvidia-smi --query-gpu=index,uuid,name,memory.total,pci.bus_id,driver_version,temperature.gpu,power.draw,utilization.gpu --format=csv || rc=1
step "TestNVMLReal"
"$bin/gpu.test" -test.run 'TestNVMLReal' -test.v -test.count=1 2>&1 | tee "$out/gpu-test.log"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
step "runtime: TestDeviceMinorsOnRealDriver and the linux-user cycle (as $(id -un))"
CI=true "$bin/runtime.test" -test.run 'TestDeviceMinorsOnRealDriver|TestLinuxUser' -test.v -test.count=1 2>&1 | tee "$out/runtime-test.log"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
step "gantry-nodeagent gpu (idle)"
"$bin/gantry-nodeagent" --config /nonexistent.yaml gpu --gpu-backend nvml 2>&1 | tee "$out/gpu-idle.txt"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
"$bin/gantry-nodeagent" --config /nonexistent.yaml gpu --gpu-backend nvml --json > "$out/gpu-idle.json" 2>&1 || rc=1
step "gantry-nodeagent gpu (under load)"
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  python3 - <<'PY' &
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
x = torch.empty(20 * 1024**3, dtype=torch.uint8, device="cuda")  # 20 GiB held, so memory used moves
end = time.time() + 14
while time.time() < end:
    for _ in range(50):
        c = a @ b
    torch.cuda.synchronize()
PY
  load=$!
  sleep 8
  "$bin/gantry-nodeagent" --config /nonexistent.yaml gpu --gpu-backend nvml 2>&1 | tee "$out/gpu-load.txt"
  "$bin/gantry-nodeagent" --config /nonexistent.yaml gpu --gpu-backend nvml --json > "$out/gpu-load.json" 2>&1 || rc=1
  wait $load || rc=1
else
  echo "no PyTorch with CUDA here: load sample skipped"; rc=1
fi
echo; echo "== result rc=$rc"
exit $rc
