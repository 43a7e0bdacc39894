package gpu

import (
	"fmt"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxb200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/uuid"
)

// mockUUIDSpace is the UUIDv5 namespace of mock GPU UUIDs.
var mockUUIDSpace = uuid.MustParse("6b1c1f0e-3f5a-4c1e-9a57-7d1f3f0a6a10")

// dgxBusIDs is the PCI layout of a DGX H100 baseboard (nvidia-smi on a real DGX), used
// for every mock so bus ids look like the ones operators know.
var dgxBusIDs = []uint32{0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb}

// Mock is a go-nvml DGX mock server read through the same code as the real library,
// with the values the upstream mock leaves nil filled deterministically: an idle GPU at
// 0 % utilization and 0 bytes used, 30–33 °C, 69–76 W, no ECC errors, no XIDs. Tests
// change them with the Set/Inject methods.
type Mock struct {
	*nvmlBackend
	srv    *server.Server
	events chan nvml.EventData

	mu    sync.Mutex
	state []mockGPU
	xids  int // XIDs handed to the watcher and recorded
}

type mockGPU struct {
	util           uint32
	memUsed        uint64
	tempC          uint32
	powerMW        uint32
	eccCorrected   uint64
	eccUncorrected uint64
}

// NewMock builds the named mock backend ("mock-h100", "mock-a100", "mock-h200",
// "mock-b200"): 8 GPUs of that model.
func NewMock(name string, opts Options) (*Mock, error) {
	var srv *server.Server
	switch name {
	case BackendMockH100:
		srv = dgxh100.New()
	case BackendMockA100:
		srv = dgxa100.New()
	case BackendMockH200:
		srv = dgxh200.New()
	case BackendMockB200:
		srv = dgxb200.New()
	default:
		return nil, fmt.Errorf("gpu: unknown mock backend %q", name)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	seed := opts.MockSeed
	if seed == "" {
		seed = "gantry-mock"
	}
	m := &Mock{srv: srv, events: make(chan nvml.EventData, 64), state: make([]mockGPU, len(srv.Devices))}
	for i, d := range srv.Devices {
		dev := d.(*server.Device)
		m.state[i] = mockGPU{tempC: 30 + uint32(i%4), powerMW: 69_000 + 1_000*uint32(i)}
		m.fill(i, dev, seed, name)
	}
	srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return &mock.EventSet{
			WaitFunc: func(timeoutMillis uint32) (nvml.EventData, nvml.Return) {
				select {
				case ev := <-m.events:
					return ev, nvml.SUCCESS
				case <-time.After(time.Duration(timeoutMillis) * time.Millisecond):
					return nvml.EventData{}, nvml.ERROR_TIMEOUT
				}
			},
			FreeFunc: func() nvml.Return { return nvml.SUCCESS },
		}, nvml.SUCCESS
	}
	b, err := newNVMLBackend(name, srv, opts.Now)
	if err != nil {
		return nil, err
	}
	m.nvmlBackend = b
	return m, nil
}

func (m *Mock) fill(i int, dev *server.Device, seed, name string) {
	dev.UUID = "GPU-" + uuid.NewSHA1(mockUUIDSpace, fmt.Appendf(nil, "%s/%s/%d", seed, name, i)).String()
	bus := dgxBusIDs[i%len(dgxBusIDs)]
	dev.PciBusID = fmt.Sprintf("00000000:%02X:00.0", bus)
	dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		p := nvml.PciInfo{Domain: 0, Bus: bus, Device: 0, PciDeviceId: dev.Config.PciDeviceId}
		for j, c := range []byte(dev.PciBusID) {
			p.BusId[j] = int8(c)
		}
		return p, nvml.SUCCESS
	}
	dev.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		m.mu.Lock()
		defer m.mu.Unlock()
		total := dev.MemoryInfo.Total
		used := min(m.state[i].memUsed, total)
		return nvml.Memory{Total: total, Used: used, Free: total - used}, nvml.SUCCESS
	}
	dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
		m.mu.Lock()
		defer m.mu.Unlock()
		return nvml.Utilization{Gpu: m.state[i].util, Memory: m.state[i].util / 2}, nvml.SUCCESS
	}
	dev.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.state[i].tempC, nvml.SUCCESS
	}
	dev.GetPowerUsageFunc = func() (uint32, nvml.Return) {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.state[i].powerMW, nvml.SUCCESS
	}
	dev.GetTotalEccErrorsFunc = func(t nvml.MemoryErrorType, _ nvml.EccCounterType) (uint64, nvml.Return) {
		m.mu.Lock()
		defer m.mu.Unlock()
		if t == nvml.MEMORY_ERROR_TYPE_UNCORRECTED {
			return m.state[i].eccUncorrected, nvml.SUCCESS
		}
		return m.state[i].eccCorrected, nvml.SUCCESS
	}
	dev.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
}

// SetLoad sets GPU i's utilization (percent) and memory in use (bytes). As on a real
// GPU, load also warms it up and draws power.
func (m *Mock) SetLoad(i int, utilPercent uint32, memUsedBytes uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := &m.state[i]
	s.util, s.memUsed = min(utilPercent, 100), memUsedBytes
	s.tempC = 30 + uint32(i%4) + s.util*45/100
	s.powerMW = 69_000 + 1_000*uint32(i) + s.util*6_000
}

// SetECC sets GPU i's volatile ECC counters.
func (m *Mock) SetECC(i int, corrected, uncorrected uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.state[i].eccCorrected, m.state[i].eccUncorrected = corrected, uncorrected
}

// SetMIG turns MIG mode on GPU i on or off (an inventory change).
func (m *Mock) SetMIG(i int, enabled bool) {
	mode := nvml.DEVICE_MIG_DISABLE
	if enabled {
		mode = nvml.DEVICE_MIG_ENABLE
	}
	m.srv.Devices[i].(*server.Device).SetMigMode(mode)
}

// InjectXID raises XID code on GPU i through the NVML event path and returns once the
// event watcher has recorded it, so the next Sample reports it.
func (m *Mock) InjectXID(i int, code uint64) {
	m.mu.Lock()
	m.xids++
	want := m.xids
	m.mu.Unlock()
	m.events <- nvml.EventData{Device: m.srv.Devices[i], EventType: nvml.EventTypeXidCriticalError, EventData: code}
	for {
		m.nvmlBackend.mu.Lock()
		n := m.nvmlBackend.recorded
		m.nvmlBackend.mu.Unlock()
		if n >= want {
			return
		}
		time.Sleep(time.Millisecond)
	}
}
