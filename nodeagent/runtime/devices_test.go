package runtime

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/nodeagent/gpu"
)

// driverInfo is /proc/driver/nvidia/gpus/<bus>/information as the 550 driver writes it.
const driverInfo = `Model: 		 NVIDIA H100 80GB HBM3
IRQ:   		 1284
GPU UUID: 	 GPU-9a1e3a5c-0000-4000-8000-000000000000
Video BIOS: 	 96.00.74.00.0d
Bus Type: 	 PCIe
DMA Size: 	 52 bits
DMA Mask: 	 0xfffffffffffff
Bus Location: 	 0000:%s
Device Minor: 	 %s
GPU Excluded:	 No
`

func TestDeviceMinorsReadTheDriver(t *testing.T) {
	dir := t.TempDir()
	for bus, minor := range map[string]string{"18:00.0": "4", "2a:00.0": "0", "9a:00.0": "x"} {
		must(t, os.MkdirAll(filepath.Join(dir, "0000:"+bus), 0o755))
		body := strings.Replace(strings.Replace(driverInfo, "%s", bus, 1), "%s", minor, 1)
		must(t, os.WriteFile(filepath.Join(dir, "0000:"+bus, "information"), []byte(body), 0o644))
	}
	// NVML's bus ids carry a 32-bit domain; the minor is not the index.
	got, err := deviceMinors(dir, []gpu.GPU{
		{UUID: "GPU-a", Index: 0, PCIBusID: "00000000:18:00.0"},
		{UUID: "GPU-b", Index: 1, PCIBusID: "00000000:2A:00.0"},
	})
	if err != nil || !slices.Equal(got, []int{4, 0}) {
		t.Fatalf("minors %v %v", got, err)
	}
	for name, g := range map[string]gpu.GPU{
		"unparsable minor": {UUID: "GPU-c", PCIBusID: "00000000:9A:00.0"},
		"no such bus":      {UUID: "GPU-d", PCIBusID: "00000000:DB:00.0"},
	} {
		if _, err := deviceMinors(dir, []gpu.GPU{g}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestDeviceDropIn(t *testing.T) {
	got := string(deviceDropIn("0190f6a0-0000-7000-8000-000000000001", "g0190f6a00000", []int{4, 0}))
	want := `# Written by gantry-nodeagent for allocation 0190f6a0-0000-7000-8000-000000000001 (user g0190f6a00000); removed on release.
# Only this allocation's GPUs (and the NVIDIA control devices) are reachable from the user's sessions.
[Slice]
DevicePolicy=closed
DeviceAllow=/dev/nvidiactl rw
DeviceAllow=/dev/nvidia-uvm rw
DeviceAllow=/dev/nvidia-uvm-tools rw
DeviceAllow=/dev/nvidia-modeset rw
DeviceAllow=char-nvidia-caps r
DeviceAllow=char-infiniband_verbs rw
DeviceAllow=/dev/infiniband/rdma_cm rw
DeviceAllow=/dev/fuse rw
DeviceAllow=/dev/nvidia4 rw
DeviceAllow=/dev/nvidia0 rw
`
	if got != want {
		t.Fatalf("drop-in:\n%s\nwant:\n%s", got, want)
	}
}
