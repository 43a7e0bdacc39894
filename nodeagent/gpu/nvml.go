package gpu

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// fatalXIDs are XID codes after which the GPU needs a reset or a node drain (NVIDIA's
// XID catalogue: 48 DBE, 62/63/64 row remapping and ECC page retirement failures,
// 74 NVLink, 79 fallen off the bus, 92 high SBE rate, 94/95 contained/uncontained ECC,
// 119/120 GSP errors). Once seen, the GPU reports unhealthy until the agent restarts.
var fatalXIDs = map[uint64]bool{48: true, 62: true, 63: true, 64: true, 74: true, 79: true, 92: true, 94: true, 95: true, 119: true, 120: true}

// xidWaitMillis bounds one EventSet.Wait so Close is noticed promptly.
const xidWaitMillis = 500

// nvmlBackend reads any nvml.Interface: the real library or a go-nvml mock server.
type nvmlBackend struct {
	name string
	lib  nvml.Interface
	now  func() time.Time

	mu       sync.Mutex
	closed   bool
	pending  map[string][]uint64 // UUID → XID codes not yet reported
	fatal    map[string]bool     // UUID → a fatal XID was seen
	recorded int                 // XID events recorded since start

	stop    chan struct{}
	done    chan struct{}
	changed chan struct{}
}

func newNVMLBackend(name string, lib nvml.Interface, now func() time.Time) (*nvmlBackend, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
			return nil, ErrNoDriver
		}
		return nil, fmt.Errorf("gpu: nvml init: %w", ret)
	}
	b := &nvmlBackend{
		name:    name,
		lib:     lib,
		now:     now,
		pending: map[string][]uint64{},
		fatal:   map[string]bool{},
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		changed: make(chan struct{}, 1),
	}
	if err := b.watchXIDs(); err != nil {
		// Without events we still report everything else; XIDs show up in the kernel log.
		close(b.done)
	}
	return b, nil
}

func openReal(opts Options) (Backend, error) {
	return newNVMLBackend(BackendNVML, nvml.New(), opts.Now)
}

func (b *nvmlBackend) Name() string { return b.name }

func (b *nvmlBackend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	b.mu.Unlock()
	close(b.stop)
	<-b.done
	if ret := b.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("gpu: nvml shutdown: %w", ret)
	}
	return nil
}

// Inventory implements Backend.
func (b *nvmlBackend) Inventory(ctx context.Context) (Inventory, error) {
	if err := b.usable(ctx); err != nil {
		return Inventory{}, err
	}
	driver, ret := b.lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		return Inventory{}, fmt.Errorf("gpu: driver version: %w", ret)
	}
	cudaInt, ret := b.lib.SystemGetCudaDriverVersion()
	if ret != nvml.SUCCESS {
		return Inventory{}, fmt.Errorf("gpu: cuda version: %w", ret)
	}
	cuda := fmt.Sprintf("%d.%d", cudaInt/1000, (cudaInt%1000)/10)
	devs, err := b.devices()
	if err != nil {
		return Inventory{}, err
	}
	inv := Inventory{DriverVersion: driver, CUDAVersion: cuda, GPUs: make([]GPU, 0, len(devs))}
	for i, d := range devs {
		g := GPU{Index: i, DriverVersion: driver, CUDAVersion: cuda}
		if g.UUID, ret = d.GetUUID(); ret != nvml.SUCCESS {
			return Inventory{}, fmt.Errorf("gpu %d: uuid: %w", i, ret)
		}
		if g.Model, ret = d.GetName(); ret != nvml.SUCCESS {
			return Inventory{}, fmt.Errorf("gpu %d: name: %w", i, ret)
		}
		mem, ret := d.GetMemoryInfo()
		if ret != nvml.SUCCESS {
			return Inventory{}, fmt.Errorf("gpu %d: memory: %w", i, ret)
		}
		g.MemoryBytes = mem.Total
		pci, ret := d.GetPciInfo()
		if ret != nvml.SUCCESS {
			return Inventory{}, fmt.Errorf("gpu %d: pci info: %w", i, ret)
		}
		g.PCIBusID = busID(pci)
		g.PCIDeviceID = pci.PciDeviceId
		// MIG is not supported on pre-Ampere and consumer parts: that is "disabled".
		if cur, _, ret := d.GetMigMode(); ret == nvml.SUCCESS {
			g.MIGSupported, g.MIGEnabled = true, cur == nvml.DEVICE_MIG_ENABLE
		} else if ret != nvml.ERROR_NOT_SUPPORTED {
			return Inventory{}, fmt.Errorf("gpu %d: mig mode: %w", i, ret)
		}
		inv.GPUs = append(inv.GPUs, g)
	}
	return inv, nil
}

// Sample implements Backend. Counters a device does not support (ECC on consumer
// parts, power on some boards) read as zero rather than failing the whole sample.
func (b *nvmlBackend) Sample(ctx context.Context) ([]Metrics, error) {
	if err := b.usable(ctx); err != nil {
		return nil, err
	}
	devs, err := b.devices()
	if err != nil {
		return nil, err
	}
	at := b.now().UTC()
	out := make([]Metrics, 0, len(devs))
	for i, d := range devs {
		uuid, ret := d.GetUUID()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("gpu %d: uuid: %w", i, ret)
		}
		m := Metrics{UUID: uuid, SampledAt: at}
		if u, ret := d.GetUtilizationRates(); ok(ret) {
			m.UtilizationPercent = u.Gpu
		} else if ret != nvml.ERROR_NOT_SUPPORTED {
			return nil, fmt.Errorf("gpu %d: utilization: %w", i, ret)
		}
		if mem, ret := d.GetMemoryInfo(); ok(ret) {
			m.MemoryUsedBytes = mem.Used
		} else {
			return nil, fmt.Errorf("gpu %d: memory: %w", i, ret)
		}
		if t, ret := d.GetTemperature(nvml.TEMPERATURE_GPU); ok(ret) {
			m.TemperatureC = t
		} else if ret != nvml.ERROR_NOT_SUPPORTED {
			return nil, fmt.Errorf("gpu %d: temperature: %w", i, ret)
		}
		if p, ret := d.GetPowerUsage(); ok(ret) {
			m.PowerMilliwatts = p
		} else if ret != nvml.ERROR_NOT_SUPPORTED {
			return nil, fmt.Errorf("gpu %d: power: %w", i, ret)
		}
		if c, ret := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC); ok(ret) {
			m.ECCCorrected = c
		} else if !eccUnavailable(ret) {
			return nil, fmt.Errorf("gpu %d: ecc corrected: %w", i, ret)
		}
		if c, ret := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC); ok(ret) {
			m.ECCUncorrected = c
		} else if !eccUnavailable(ret) {
			return nil, fmt.Errorf("gpu %d: ecc uncorrected: %w", i, ret)
		}
		out = append(out, m)
	}
	b.mu.Lock()
	for i := range out {
		u := out[i].UUID
		out[i].XIDErrors = b.pending[u]
		delete(b.pending, u)
		out[i].Healthy = out[i].ECCUncorrected == 0 && !b.fatal[u]
	}
	b.mu.Unlock()
	return out, nil
}

func ok(r nvml.Return) bool { return r == nvml.SUCCESS }

// ECC counters are absent when ECC is off or unsupported; NVML says either.
func eccUnavailable(r nvml.Return) bool {
	return r == nvml.ERROR_NOT_SUPPORTED || r == nvml.ERROR_NO_PERMISSION
}

func (b *nvmlBackend) usable(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errors.New("gpu: backend closed")
	}
	return nil
}

func (b *nvmlBackend) devices() ([]nvml.Device, error) {
	n, ret := b.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("gpu: device count: %w", ret)
	}
	devs := make([]nvml.Device, 0, n)
	for i := range n {
		d, ret := b.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("gpu %d: handle: %w", i, ret)
		}
		devs = append(devs, d)
	}
	return devs, nil
}

// watchXIDs registers every device for critical XID events and collects them in the
// background until Close. A device that does not support events is skipped.
func (b *nvmlBackend) watchXIDs() error {
	set, ret := b.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return ret
	}
	devs, err := b.devices()
	if err != nil {
		set.Free()
		return err
	}
	registered := 0
	for _, d := range devs {
		if d.RegisterEvents(nvml.EventTypeXidCriticalError, set) == nvml.SUCCESS {
			registered++
		}
	}
	if registered == 0 {
		set.Free()
		return nvml.ERROR_NOT_SUPPORTED
	}
	go func() {
		defer close(b.done)
		defer set.Free()
		for {
			select {
			case <-b.stop:
				return
			default:
			}
			ev, ret := set.Wait(xidWaitMillis)
			if ret == nvml.ERROR_TIMEOUT {
				continue
			}
			if ret != nvml.SUCCESS {
				// A persistent failure (GPU lost, driver unloading) must not spin.
				select {
				case <-b.stop:
					return
				case <-time.After(time.Second):
				}
				continue
			}
			if ev.Device == nil || ev.EventType&nvml.EventTypeXidCriticalError == 0 {
				continue
			}
			uuid, ret := ev.Device.GetUUID()
			if ret != nvml.SUCCESS {
				continue
			}
			b.recordXID(uuid, ev.EventData)
		}
	}()
	return nil
}

// maxPendingXIDs caps the XIDs kept per GPU between two samples (an XID storm must not
// grow memory without bound); the newest are kept.
const maxPendingXIDs = 64

func (b *nvmlBackend) recordXID(uuid string, code uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.recorded++
	p := append(b.pending[uuid], code)
	if len(p) > maxPendingXIDs {
		p = p[len(p)-maxPendingXIDs:]
	}
	b.pending[uuid] = p
	if fatalXIDs[code] {
		b.fatal[uuid] = true
	}
	select {
	case b.changed <- struct{}{}:
	default:
	}
}

// Changed implements Notifier: it signals after an XID event was recorded.
func (b *nvmlBackend) Changed() <-chan struct{} { return b.changed }

// busID turns NVML's NUL-terminated C char array into a string, unchanged
// ("00000000:18:00.0", as nvidia-smi prints it).
func busID(p nvml.PciInfo) string {
	var sb strings.Builder
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}
