package gpu

import (
	"context"
	"regexp"
	"testing"
	"time"
)

var gpuUUID = regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

func openMock(t *testing.T, name, seed string) *Mock {
	t.Helper()
	at := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	m, err := NewMock(name, Options{MockSeed: seed, Now: func() time.Time { return at }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Error(err)
		}
	})
	return m
}

func TestMockH100Inventory(t *testing.T) {
	m := openMock(t, BackendMockH100, "node-a")
	inv, err := m.Inventory(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if inv.DriverVersion != "550.54.15" || inv.CUDAVersion != "12.4" {
		t.Fatalf("driver/cuda = %q/%q, want 550.54.15/12.4", inv.DriverVersion, inv.CUDAVersion)
	}
	if len(inv.GPUs) != 8 {
		t.Fatalf("got %d GPUs, want 8", len(inv.GPUs))
	}
	wantBus := []string{"00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0", "00000000:9A:00.0", "00000000:AB:00.0", "00000000:BA:00.0", "00000000:DB:00.0"}
	seen := map[string]bool{}
	for i, g := range inv.GPUs {
		if g.Index != i || g.Model != "NVIDIA H100 80GB HBM3" || g.MemoryBytes != 80*1024*1024*1024 {
			t.Errorf("gpu %d = %+v", i, g)
		}
		if !gpuUUID.MatchString(g.UUID) || seen[g.UUID] {
			t.Errorf("gpu %d uuid %q malformed or repeated", i, g.UUID)
		}
		seen[g.UUID] = true
		if g.PCIBusID != wantBus[i] || g.PCIDeviceID != 0x233010DE {
			t.Errorf("gpu %d pci = %s %#x, want %s 0x233010DE", i, g.PCIBusID, g.PCIDeviceID, wantBus[i])
		}
		if g.MIGEnabled || !g.MIGSupported || g.DriverVersion != "550.54.15" || g.CUDAVersion != "12.4" {
			t.Errorf("gpu %d = %+v", i, g)
		}
	}
}

func TestMockUUIDsStablePerSeed(t *testing.T) {
	a1, _ := openMock(t, BackendMockH100, "node-a").Inventory(context.Background())
	a2, _ := openMock(t, BackendMockH100, "node-a").Inventory(context.Background())
	b, _ := openMock(t, BackendMockH100, "node-b").Inventory(context.Background())
	if !a1.Equal(a2) {
		t.Fatal("same seed gave different inventories")
	}
	for i := range a1.GPUs {
		if a1.GPUs[i].UUID == b.GPUs[i].UUID {
			t.Fatalf("gpu %d: different seeds share uuid %s", i, a1.GPUs[i].UUID)
		}
	}
}

func TestMockModels(t *testing.T) {
	cases := []struct {
		backend string
		model   string
		memMiB  uint64
	}{
		{BackendMockH100, "NVIDIA H100 80GB HBM3", 81920},
		{BackendMockA100, "Mock NVIDIA A100-SXM4-40GB", 40960},
		{BackendMockH200, "NVIDIA H200 141GB HBM3e", 144384},
		{BackendMockB200, "NVIDIA B200 180GB HBM3e", 184320},
	}
	for _, c := range cases {
		t.Run(c.backend, func(t *testing.T) {
			b, err := Open(c.backend, Options{MockSeed: "x"})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			inv, err := b.Inventory(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if len(inv.GPUs) != 8 {
				t.Fatalf("%d GPUs", len(inv.GPUs))
			}
			for _, g := range inv.GPUs {
				if g.Model != c.model || g.MemoryBytes != c.memMiB<<20 {
					t.Fatalf("gpu = %+v, want %s with %d MiB", g, c.model, c.memMiB)
				}
			}
			if _, err := b.Sample(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestMockIdleSampleIsDeterministic(t *testing.T) {
	m := openMock(t, BackendMockH100, "node-a")
	inv, _ := m.Inventory(context.Background())
	s, err := m.Sample(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(s) != 8 {
		t.Fatalf("%d samples", len(s))
	}
	for i, x := range s {
		want := Metrics{
			UUID: inv.GPUs[i].UUID, TemperatureC: 30 + uint32(i%4), PowerMilliwatts: 69_000 + 1_000*uint32(i),
			Healthy: true, SampledAt: time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC),
		}
		if x.UUID != want.UUID || x.UtilizationPercent != 0 || x.MemoryUsedBytes != 0 || x.TemperatureC != want.TemperatureC ||
			x.PowerMilliwatts != want.PowerMilliwatts || x.ECCCorrected != 0 || x.ECCUncorrected != 0 ||
			len(x.XIDErrors) != 0 || !x.Healthy || !x.SampledAt.Equal(want.SampledAt) {
			t.Errorf("sample %d = %+v, want %+v", i, x, want)
		}
	}
}

func TestMockLoadECCAndXID(t *testing.T) {
	m := openMock(t, BackendMockH100, "node-a")
	m.SetLoad(2, 87, 40<<30)
	m.SetECC(3, 5, 0)
	m.SetECC(4, 0, 1)
	m.InjectXID(5, 31) // page fault: not fatal
	m.InjectXID(6, 79) // fallen off the bus: fatal
	m.InjectXID(6, 31)

	s, err := m.Sample(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if s[2].UtilizationPercent != 87 || s[2].MemoryUsedBytes != 40<<30 || s[2].TemperatureC != 32+87*45/100 || s[2].PowerMilliwatts != 71_000+87*6_000 {
		t.Errorf("loaded gpu = %+v", s[2])
	}
	if s[3].ECCCorrected != 5 || !s[3].Healthy {
		t.Errorf("corrected ECC must not make a GPU unhealthy: %+v", s[3])
	}
	if s[4].ECCUncorrected != 1 || s[4].Healthy {
		t.Errorf("uncorrected ECC must make a GPU unhealthy: %+v", s[4])
	}
	if len(s[5].XIDErrors) != 1 || s[5].XIDErrors[0] != 31 || !s[5].Healthy {
		t.Errorf("xid 31 = %+v", s[5])
	}
	if len(s[6].XIDErrors) != 2 || s[6].XIDErrors[0] != 79 || s[6].XIDErrors[1] != 31 || s[6].Healthy {
		t.Errorf("xid 79 = %+v", s[6])
	}

	// XIDs are reported once; a fatal one keeps the GPU unhealthy.
	s, err = m.Sample(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(s[5].XIDErrors) != 0 || len(s[6].XIDErrors) != 0 || s[6].Healthy || !s[5].Healthy {
		t.Errorf("second sample: %+v / %+v", s[5], s[6])
	}
}

func TestMockMIGChangesInventory(t *testing.T) {
	m := openMock(t, BackendMockH100, "node-a")
	before, _ := m.Inventory(context.Background())
	m.SetMIG(1, true)
	after, _ := m.Inventory(context.Background())
	if before.Equal(after) || !after.GPUs[1].MIGEnabled || after.GPUs[0].MIGEnabled {
		t.Fatalf("MIG change not seen: %+v", after.GPUs[:2])
	}
}

func TestXIDStormIsBounded(t *testing.T) {
	m := openMock(t, BackendMockH100, "node-a")
	for range maxPendingXIDs + 10 {
		m.InjectXID(0, 13)
	}
	s, _ := m.Sample(context.Background())
	if len(s[0].XIDErrors) != maxPendingXIDs {
		t.Fatalf("kept %d XIDs, want %d", len(s[0].XIDErrors), maxPendingXIDs)
	}
}

func TestOpenUnknownBackend(t *testing.T) {
	if _, err := Open("mock-k80", Options{}); err == nil {
		t.Fatal("unknown backend accepted")
	}
}

func TestClosedBackendRefuses(t *testing.T) {
	m, err := NewMock(BackendMockH100, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	if _, err := m.Sample(context.Background()); err == nil {
		t.Fatal("sample after close succeeded")
	}
}

func TestChangedSignalsXID(t *testing.T) {
	m := openMock(t, BackendMockH100, "node-a")
	select {
	case <-m.Changed():
		t.Fatal("signal before any event")
	default:
	}
	m.InjectXID(1, 48)
	select {
	case <-m.Changed():
	case <-time.After(10 * time.Second):
		t.Fatal("no signal after an XID")
	}
}
