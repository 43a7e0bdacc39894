package maastest

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Failure is a fault injected into one machine. Each fires once, the next time the step
// it names runs, and is then spent (Inject again for another).
type Failure string

// Injectable failures.
const (
	// FailCommissioning ends the next commissioning in Failed commissioning.
	FailCommissioning Failure = "commissioning"
	// FailTesting ends the tests after the next commissioning in Failed testing.
	FailTesting Failure = "testing"
	// FailDeployment ends the next deployment in Failed deployment.
	FailDeployment Failure = "deployment"
	// FailReleasing ends the next release without erase in Failed releasing.
	FailReleasing Failure = "releasing"
	// FailErasing ends the next disk erase in Failed disk erasing.
	FailErasing Failure = "erasing"
	// PowerFailure makes the next power action fail: the BMC does not answer. A
	// commission or deploy started then fails (Failed commissioning / deployment,
	// "Power on for the node failed"), a release fails (Failed releasing), and
	// power_on, power_off and query_power_state answer 503.
	PowerFailure Failure = "power"
	// Stall makes the next timed step hang until MAAS's node timeout (Durations.NodeTimeout)
	// marks it failed, or until it is aborted.
	Stall Failure = "stall"
)

// GPU models the simulator can put in a machine: the go-nvml mock the booted agent runs
// on and the PCI identity MAAS's commissioning inventory reports for it.
var GPUModels = map[string]GPUModel{
	"mock-h100": {Backend: "mock-h100", VendorID: "10de", ProductID: "2330", ProductName: "GH100 [H100 SXM5 80GB]"},
	"mock-a100": {Backend: "mock-a100", VendorID: "10de", ProductID: "20b0", ProductName: "GA100 [A100 SXM4 40GB]"},
	"mock-h200": {Backend: "mock-h200", VendorID: "10de", ProductID: "2335", ProductName: "GH100 [H200 SXM 141GB]"},
	"mock-b200": {Backend: "mock-b200", VendorID: "10de", ProductID: "2901", ProductName: "GB100 [B200]"},
}

// GPUModel is one entry of GPUModels.
type GPUModel struct {
	Backend, VendorID, ProductID, ProductName string
}

// NVIDIAVendorName is the vendor_name MAAS reports for PCI vendor 10de.
const NVIDIAVendorName = "NVIDIA Corporation"

// MachineSpec describes a machine added to the simulator.
type MachineSpec struct {
	// SystemID is MAAS's id (default: generated, 6 lower-case characters).
	SystemID string
	// Hostname (default "gpu-<system id>").
	Hostname string
	// New adds the machine in status New: not commissioned, so no hardware inventory
	// yet. Otherwise it is Ready (commissioned).
	New bool
	// CPUCount and MemoryMiB (defaults 64 and 512 GiB) appear once commissioned.
	CPUCount  int
	MemoryMiB int64
	// Arch (default amd64/generic).
	Arch string
	// Pool, Zone (default "default") and Tags.
	Pool, Zone string
	Tags       []string
	// GPU is a key of GPUModels (default mock-h100); "none" for a machine without GPUs.
	GPU string
	// GPUCount is how many GPUs commissioning reports (default 8, what the mocks have).
	GPUCount int
	// IPAddresses the machine reports (default 10.30.0.N).
	IPAddresses []string
}

// machine is one simulated machine; the Server's mutex guards it.
type machine struct {
	spec          MachineSpec
	status        Status
	before        Status // the status an abort or un-missing returns to
	statusMessage string
	power         string
	commissioned  bool
	owner         string
	agentName     string
	comment       string
	osystem       string
	distroSeries  string
	hweKernel     string
	userData      []byte
	storageLayout string
	failures      map[Failure]bool
	gen           int // bumped by every new action: a pending timer of an older one does nothing
	timer         *time.Timer

	deploys, allocations, commissions, releases, powerOns, layoutSets int
	lastErase                                                         string
	boot                                                              Instance // the booted OS (kept across power cycles)
	running                                                           bool     // boot is up (powered on and started)
	bootErr                                                           string
	bootDir                                                           string
}

// Machine is a snapshot of a simulated machine, for tests.
type Machine struct {
	SystemID, Hostname string
	Status             Status
	StatusMessage      string
	PowerState         string
	Owner, AgentName   string
	OSystem            string
	DistroSeries       string
	// UserData is the decoded user data of the last deploy.
	UserData []byte
	// Counts of accepted actions since the machine was added.
	Deploys, Allocations, Commissions, Releases, PowerOns int
	// StorageLayout is the layout the next deploy installs (DefaultStorageLayout until
	// set_storage_layout changed it); LayoutSets counts accepted set_storage_layout calls.
	StorageLayout string
	LayoutSets    int
	// LastErase is the erase mode of the last release: "quick", "secure", "full" or "".
	LastErase string
	// Booted reports a running boot (AgentBooter: the agent process); BootError is the
	// last boot's failure ("" when none); BootDir is its sandbox.
	Booted    bool
	BootError string
	BootDir   string
}

func (m *machine) snapshot() Machine {
	return Machine{
		SystemID: m.spec.SystemID, Hostname: m.spec.Hostname, Status: m.status, StatusMessage: m.statusMessage,
		PowerState: m.power, Owner: m.owner, AgentName: m.agentName, OSystem: m.osystem, DistroSeries: m.distroSeries,
		UserData: append([]byte(nil), m.userData...), Deploys: m.deploys, Allocations: m.allocations,
		Commissions: m.commissions, Releases: m.releases, PowerOns: m.powerOns, LastErase: m.lastErase,
		StorageLayout: m.storageLayout, LayoutSets: m.layoutSets,
		Booted: m.running, BootError: m.bootErr, BootDir: m.bootDir,
	}
}

// halt marks a running boot stopped and returns it for the caller to Stop outside the
// lock (nil when nothing runs).
func (m *machine) halt() Instance {
	if !m.running {
		return nil
	}
	m.running = false
	return m.boot
}

// take consumes an injected failure.
func (m *machine) take(f Failure) bool {
	if m.failures[f] {
		delete(m.failures, f)
		return true
	}
	return false
}

func (m *machine) set(s Status, msg string) {
	m.status, m.statusMessage = s, msg
}

// machineJSON is the machine object of the API (the fields gomaasclient's
// entity.Machine reads that Gantry uses, plus what MAAS always sends).
type machineJSON struct {
	SystemID      string            `json:"system_id"`
	Hostname      string            `json:"hostname"`
	FQDN          string            `json:"fqdn"`
	Domain        nameRef           `json:"domain"`
	Status        int               `json:"status"`
	StatusName    string            `json:"status_name"`
	StatusMessage string            `json:"status_message"`
	StatusAction  string            `json:"status_action"`
	PowerState    string            `json:"power_state"`
	PowerType     string            `json:"power_type"`
	Pool          nameRef           `json:"pool"`
	Zone          nameRef           `json:"zone"`
	TagNames      []string          `json:"tag_names"`
	CPUCount      int               `json:"cpu_count"`
	Memory        int64             `json:"memory"`
	Architecture  string            `json:"architecture"`
	OSystem       string            `json:"osystem"`
	DistroSeries  string            `json:"distro_series"`
	HWEKernel     string            `json:"hwe_kernel"`
	Owner         *string           `json:"owner"`
	IPAddresses   []string          `json:"ip_addresses"`
	HardwareInfo  map[string]string `json:"hardware_info"`
	NodeType      int               `json:"node_type"`
	NodeTypeName  string            `json:"node_type_name"`
	ResourceURI   string            `json:"resource_uri"`
}

type nameRef struct {
	Name        string `json:"name"`
	ID          int    `json:"id"`
	ResourceURI string `json:"resource_uri,omitempty"`
}

func (m *machine) json() machineJSON {
	j := machineJSON{
		SystemID: m.spec.SystemID, Hostname: m.spec.Hostname, FQDN: m.spec.Hostname + ".maas",
		Domain: nameRef{Name: "maas"}, Status: int(m.status), StatusName: m.status.String(),
		StatusMessage: m.statusMessage, PowerState: m.power, PowerType: "ipmi",
		Pool: nameRef{Name: m.spec.Pool}, Zone: nameRef{Name: m.spec.Zone},
		TagNames: append([]string{}, m.spec.Tags...), Architecture: m.spec.Arch,
		OSystem: m.osystem, DistroSeries: m.distroSeries, HWEKernel: m.hweKernel,
		IPAddresses: append([]string{}, m.spec.IPAddresses...), NodeTypeName: "Machine",
		ResourceURI: apiPrefix + "machines/" + m.spec.SystemID + "/", HardwareInfo: map[string]string{},
	}
	if m.owner != "" {
		o := m.owner
		j.Owner = &o
	}
	if m.commissioned {
		j.CPUCount, j.Memory = m.spec.CPUCount, m.spec.MemoryMiB
		j.HardwareInfo = map[string]string{"system_vendor": "Gantry Simulated", "system_product": "GPU server (" + m.spec.GPU + ")",
			"cpu_model": "Simulated CPU @ 2.0GHz", "mainboard_vendor": "Gantry Simulated"}
	}
	return j
}

// device is a node device (GET /nodes/{id}/devices/), as gomaasclient's
// entity.NodeDevice reads it.
type device struct {
	ID                  int    `json:"id"`
	SystemID            string `json:"system_id"`
	Bus                 int    `json:"bus"`
	BusName             string `json:"bus_name"`
	HardwareType        int    `json:"hardware_type"`
	HardwareTypeName    string `json:"hardware_type_name"`
	VendorID            string `json:"vendor_id"`
	ProductID           string `json:"product_id"`
	VendorName          string `json:"vendor_name"`
	ProductName         string `json:"product_name"`
	CommissioningDriver string `json:"commissioning_driver"`
	BusNumber           int    `json:"bus_number"`
	DeviceNumber        int    `json:"device_number"`
	PCIAddress          string `json:"pci_address"`
	NumaNode            int    `json:"numa_node"`
	ResourceURI         string `json:"resource_uri"`
}

// MAAS hardware types (metadataserver/enum.py HARDWARE_TYPE) and buses.
const (
	hwStorage = 3
	hwNetwork = 4
	hwGPU     = 5
	busPCIE   = 1
)

var hwTypeNames = map[int]string{0: "Node", 1: "CPU", 2: "Memory", hwStorage: "Storage", hwNetwork: "Network", hwGPU: "GPU"}

// devices is the commissioning inventory: the GPUs, one NIC and one NVMe disk.
func (m *machine) devices() []device {
	if !m.commissioned {
		return nil
	}
	var out []device
	add := func(hw int, vendor, product, vendorName, productName, driver string, bus int) {
		id := len(out) + 1
		out = append(out, device{
			ID: id, SystemID: m.spec.SystemID, Bus: busPCIE, BusName: "PCIE", HardwareType: hw, HardwareTypeName: hwTypeNames[hw],
			VendorID: vendor, ProductID: product, VendorName: vendorName, ProductName: productName, CommissioningDriver: driver,
			BusNumber: bus, PCIAddress: fmt.Sprintf("0000:%02x:00.0", bus), NumaNode: bus / 0x80,
			ResourceURI: fmt.Sprintf("%snodes/%s/devices/%d/", apiPrefix, m.spec.SystemID, id),
		})
	}
	if g, ok := GPUModels[m.spec.GPU]; ok {
		for i := 0; i < m.spec.GPUCount; i++ {
			add(hwGPU, g.VendorID, g.ProductID, NVIDIAVendorName, g.ProductName, "", 0x18+0x10*i)
		}
	}
	add(hwNetwork, "15b3", "101d", "Mellanox Technologies", "MT2892 Family [ConnectX-6 Dx]", "mlx5_core", 0x0c)
	add(hwStorage, "144d", "a80a", "Samsung Electronics Co Ltd", "NVMe SSD Controller PM9A1/PM9A3/980PRO", "nvme", 0x04)
	return out
}

// matchesDevice applies the devices endpoint's filters (each a list of accepted values,
// compared without case; hardware_type and bus by name or number).
func matchesDevice(d device, q map[string][]string) bool {
	match := func(key string, haves ...string) bool {
		vals := q[key]
		if len(vals) == 0 {
			return true
		}
		for _, v := range vals {
			for _, h := range haves {
				if strings.EqualFold(v, h) {
					return true
				}
			}
		}
		return false
	}
	return match("hardware_type", d.HardwareTypeName, fmt.Sprint(d.HardwareType)) && match("bus", d.BusName, fmt.Sprint(d.Bus)) &&
		match("vendor_id", d.VendorID) && match("product_id", d.ProductID) && match("vendor_name", d.VendorName) &&
		match("product_name", d.ProductName) && match("commissioning_driver", d.CommissioningDriver)
}

func sortedIDs(ms map[string]*machine) []string {
	ids := make([]string, 0, len(ms))
	for id := range ms {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}
