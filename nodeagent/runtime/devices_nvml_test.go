//go:build nvml

package runtime

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/gantry-gpu/gantry/nodeagent/gpu"
)

// TestDeviceMinorsOnRealDriver reads the minors of the real GPUs through the real NVML
// inventory and the driver's /proc files, and checks them against /dev/nvidiaN's own
// device numbers. Like nodeagent/gpu's TestNVMLReal it is built only with -tags nvml and
// run on purpose on a machine with a GPU (docs/nodeagent.md), where a missing driver is a
// failure, not a skip: CI machines have no GPU, so CI does not build it.
func TestDeviceMinorsOnRealDriver(t *testing.T) {
	b, err := gpu.Open(gpu.BackendNVML, gpu.Options{})
	if err != nil {
		t.Fatalf("built with -tags nvml, but NVML does not open: %v", err)
	}
	defer b.Close()
	inv, err := b.Inventory(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	minors, err := deviceMinors("/proc/driver/nvidia/gpus", inv.GPUs)
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range inv.GPUs {
		dev := filepath.Join("/dev", "nvidia"+itoa(uint32(minors[i])))
		fi, err := os.Stat(dev)
		if err != nil {
			t.Fatalf("gpu %d (%s): minor %d but %v", g.Index, g.UUID, minors[i], err)
		}
		rdev := fi.Sys().(*syscall.Stat_t).Rdev
		major, minor := (rdev>>8)&0xfff|(rdev>>32)&^0xfff, rdev&0xff|(rdev>>12)&^0xff
		if fi.Mode()&os.ModeCharDevice == 0 || major != 195 || minor != uint64(minors[i]) {
			t.Fatalf("gpu %d: %s is %v %d:%d, want char 195:%d", g.Index, dev, fi.Mode(), major, minor, minors[i])
		}
		t.Logf("gpu %d %s bus %s -> %s (195:%d)", g.Index, g.UUID, g.PCIBusID, dev, minor)
	}
}
