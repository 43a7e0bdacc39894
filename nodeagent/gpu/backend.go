package gpu

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// GPU is one device in the inventory. It changes rarely (MIG mode toggled, a device
// falling off the bus, a driver upgrade).
type GPU struct {
	Index         int    `json:"index"`
	UUID          string `json:"uuid"`
	Model         string `json:"model"`
	MemoryBytes   uint64 `json:"memory_bytes"`
	PCIBusID      string `json:"pci_bus_id"`
	PCIDeviceID   uint32 `json:"pci_device_id"`
	MIGSupported  bool   `json:"mig_supported"`
	MIGEnabled    bool   `json:"mig_enabled"`
	DriverVersion string `json:"driver_version"`
	CUDAVersion   string `json:"cuda_version"`
}

// Inventory is every GPU the backend sees, in NVML index order.
type Inventory struct {
	DriverVersion string `json:"driver_version"`
	CUDAVersion   string `json:"cuda_version"`
	GPUs          []GPU  `json:"gpus"`
}

// Equal reports whether two inventories describe the same hardware state; the agent
// re-sends its inventory only when this turns false.
func (a Inventory) Equal(b Inventory) bool {
	return a.DriverVersion == b.DriverVersion && a.CUDAVersion == b.CUDAVersion && slices.Equal(a.GPUs, b.GPUs)
}

// Metrics is one telemetry sample of one GPU.
type Metrics struct {
	UUID               string    `json:"uuid"`
	UtilizationPercent uint32    `json:"utilization_percent"`
	MemoryUsedBytes    uint64    `json:"memory_used_bytes"`
	TemperatureC       uint32    `json:"temperature_c"`
	PowerMilliwatts    uint32    `json:"power_milliwatts"`
	ECCCorrected       uint64    `json:"ecc_corrected"`
	ECCUncorrected     uint64    `json:"ecc_uncorrected"`
	XIDErrors          []uint64  `json:"xid_errors,omitempty"` // XID codes seen since the previous sample
	Healthy            bool      `json:"healthy"`
	SampledAt          time.Time `json:"sampled_at"`
}

// Backend reads the host's GPUs. Implementations are safe for concurrent use.
type Backend interface {
	// Name is the backend's configured name ("nvml", "mock-h100", ...).
	Name() string
	// Inventory reads the current inventory. Cheap enough to call on every telemetry tick.
	Inventory(ctx context.Context) (Inventory, error)
	// Sample reads one telemetry sample per GPU and drains the XID events seen since the
	// previous call.
	Sample(ctx context.Context) ([]Metrics, error)
	// Close releases the library (nvml.Shutdown) and stops the event watcher.
	Close() error
}

// Notifier is implemented by backends that learn of health events (XIDs) as they happen;
// the agent then sends a telemetry sample at once instead of at the next interval, so an
// unhealthy GPU stops receiving work within seconds. Signals coalesce.
type Notifier interface {
	Changed() <-chan struct{}
}

// ErrNoDriver is returned by Open("nvml") when the NVIDIA driver library cannot be
// loaded (no libnvidia-ml.so: not a GPU host, or the driver is not installed).
var ErrNoDriver = errors.New("gpu: no NVIDIA driver (libnvidia-ml.so not found)")

// Backend names accepted by Open.
const (
	BackendNVML     = "nvml"
	BackendMockH100 = "mock-h100"
	BackendMockA100 = "mock-a100"
	BackendMockH200 = "mock-h200"
	BackendMockB200 = "mock-b200"
)

// Names lists every backend Open accepts, for flag help and validation.
func Names() []string {
	return []string{BackendNVML, BackendMockH100, BackendMockA100, BackendMockH200, BackendMockB200}
}

// Options tune Open.
type Options struct {
	// MockSeed makes the mock backends' GPU UUIDs stable and distinct per host: the same
	// seed always yields the same UUIDs (the agent passes its node id, or the hostname
	// before enrollment). Ignored by "nvml".
	MockSeed string
	// Now is the time source for SampledAt (defaults to time.Now).
	Now func() time.Time
}

// Open returns the named backend, initialised.
func Open(name string, opts Options) (Backend, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	switch name {
	case BackendNVML:
		return openReal(opts)
	case BackendMockH100, BackendMockA100, BackendMockH200, BackendMockB200:
		return NewMock(name, opts)
	default:
		return nil, fmt.Errorf("gpu: unknown backend %q (want one of %v)", name, Names())
	}
}
