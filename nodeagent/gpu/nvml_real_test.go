//go:build nvml

package gpu

import (
	"context"
	"testing"
)

// TestNVMLReal reads the host's real GPUs through libnvidia-ml.so. It is built only with
// the nvml tag, and run on purpose on a machine with an NVIDIA GPU and driver:
//
//	go test -tags nvml -run 'TestNVMLReal|TestDeviceMinorsOnRealDriver' -v ./nodeagent/gpu ./nodeagent/runtime
//
// CI machines have no GPU, so CI does not build it (rather than have it skip, which the
// CI rule forbids); where it is built, a missing driver is a failure.
func TestNVMLReal(t *testing.T) {
	b, err := Open(BackendNVML, Options{})
	if err != nil {
		t.Fatalf("built with -tags nvml, but NVML does not open: %v", err)
	}
	defer func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	}()
	ctx := context.Background()
	inv, err := b.Inventory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("driver %s, CUDA %s, %d GPU(s)", inv.DriverVersion, inv.CUDAVersion, len(inv.GPUs))
	if inv.DriverVersion == "" || inv.CUDAVersion == "" || inv.CUDAVersion == "0.0" {
		t.Errorf("driver/cuda version missing: %+v", inv)
	}
	if len(inv.GPUs) == 0 {
		t.Fatal("driver loaded but no GPU visible")
	}
	seen := map[string]bool{}
	for _, g := range inv.GPUs {
		t.Logf("gpu %d: %s %s %d MiB bus %s device %#x MIG %v", g.Index, g.UUID, g.Model, g.MemoryBytes>>20, g.PCIBusID, g.PCIDeviceID, g.MIGEnabled)
		if !gpuUUID.MatchString(g.UUID) && !migUUID(g.UUID) {
			t.Errorf("gpu %d: unexpected uuid %q", g.Index, g.UUID)
		}
		if seen[g.UUID] {
			t.Errorf("gpu %d: repeated uuid %q", g.Index, g.UUID)
		}
		seen[g.UUID] = true
		if g.Model == "" || g.MemoryBytes == 0 || len(g.PCIBusID) < len("0000:18:00.0") || g.PCIDeviceID == 0 {
			t.Errorf("gpu %d: incomplete %+v", g.Index, g)
		}
	}
	again, err := b.Inventory(ctx)
	if err != nil || !inv.Equal(again) {
		t.Errorf("inventory not stable between two reads: %v", err)
	}
	s, err := b.Sample(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(s) != len(inv.GPUs) {
		t.Fatalf("%d samples for %d GPUs", len(s), len(inv.GPUs))
	}
	for i, m := range s {
		t.Logf("gpu %d: util %d%% mem used %d MiB temp %d C power %.1f W ecc %d/%d healthy %v",
			i, m.UtilizationPercent, m.MemoryUsedBytes>>20, m.TemperatureC, float64(m.PowerMilliwatts)/1000, m.ECCCorrected, m.ECCUncorrected, m.Healthy)
		if m.UUID != inv.GPUs[i].UUID {
			t.Errorf("sample %d for %s, inventory says %s", i, m.UUID, inv.GPUs[i].UUID)
		}
		if m.UtilizationPercent > 100 || m.MemoryUsedBytes > inv.GPUs[i].MemoryBytes || m.TemperatureC == 0 || m.TemperatureC > 125 {
			t.Errorf("sample %d out of range: %+v", i, m)
		}
	}
}

func migUUID(s string) bool { return len(s) > 4 && s[:4] == "MIG-" }
