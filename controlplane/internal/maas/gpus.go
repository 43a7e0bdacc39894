package maas

import (
	"sort"
	"strings"

	"github.com/canonical/gomaasclient/entity"
)

// pciGPUModels maps NVIDIA PCI product ids (vendor 10de) to the model name NVML reports,
// which is what SKUs and node inventories use.
var pciGPUModels = map[string]string{
	"2330": "NVIDIA H100 80GB HBM3",
	"2331": "NVIDIA H100 PCIe",
	"2335": "NVIDIA H200 141GB HBM3e",
	"2901": "NVIDIA B200 180GB HBM3e",
	"20b0": "NVIDIA A100-SXM4-40GB",
	"20b2": "NVIDIA A100-SXM4-80GB",
	"20b5": "NVIDIA A100 80GB PCIe",
	"26b9": "NVIDIA L40S",
}

// GPUCount is a model and how many of it.
type GPUCount struct {
	Model string `json:"model"`
	Count int    `json:"count"`
}

// gpusFromDevices counts the NVIDIA GPUs of a commissioning inventory by model.
func gpusFromDevices(devs []entity.NodeDevice) []GPUCount {
	counts := map[string]int{}
	for _, d := range devs {
		if !strings.EqualFold(d.VendorID, "10de") || (d.HardwareType != entity.GPU && d.HardwareTypeName != "GPU") {
			continue
		}
		model, ok := pciGPUModels[strings.ToLower(d.ProductID)]
		if !ok {
			model = "NVIDIA " + d.ProductName
		}
		counts[model]++
	}
	out := make([]GPUCount, 0, len(counts))
	for m, n := range counts {
		out = append(out, GPUCount{Model: m, Count: n})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Model < out[j].Model })
	return out
}

// makes reports whether gpus can make a SKU of gpuModel x gpuCount.
func makes(gpus []GPUCount, gpuModel string, gpuCount int) bool {
	for _, g := range gpus {
		if g.Model == gpuModel && g.Count >= gpuCount {
			return true
		}
	}
	return false
}
