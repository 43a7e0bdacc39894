package agent

import (
	"time"

	"github.com/gantry-gpu/gantry/nodeagent/gpu"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func ts(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }

func toProtoInventory(inv gpu.Inventory) *fabricv1.Inventory {
	out := &fabricv1.Inventory{Gpus: make([]*fabricv1.GPU, 0, len(inv.GPUs))}
	for _, g := range inv.GPUs {
		mig := fabricv1.MIGMode_MIG_MODE_NOT_SUPPORTED
		if g.MIGSupported {
			mig = fabricv1.MIGMode_MIG_MODE_DISABLED
			if g.MIGEnabled {
				mig = fabricv1.MIGMode_MIG_MODE_ENABLED
			}
		}
		out.Gpus = append(out.Gpus, &fabricv1.GPU{
			Index:         uint32(g.Index),
			Uuid:          g.UUID,
			Model:         g.Model,
			MemoryBytes:   g.MemoryBytes,
			DriverVersion: g.DriverVersion,
			CudaVersion:   g.CUDAVersion,
			PciBusId:      g.PCIBusID,
			MigMode:       mig,
		})
	}
	return out
}

func toProtoTelemetry(samples []gpu.Metrics) *fabricv1.Telemetry {
	out := &fabricv1.Telemetry{Gpus: make([]*fabricv1.GPUMetrics, 0, len(samples))}
	for _, m := range samples {
		out.Gpus = append(out.Gpus, &fabricv1.GPUMetrics{
			Uuid:                 m.UUID,
			UtilizationPercent:   m.UtilizationPercent,
			MemoryUsedBytes:      m.MemoryUsedBytes,
			TemperatureC:         m.TemperatureC,
			PowerMilliwatts:      m.PowerMilliwatts,
			EccErrorsCorrected:   m.ECCCorrected,
			EccErrorsUncorrected: m.ECCUncorrected,
			XidErrors:            m.XIDErrors,
			Healthy:              m.Healthy,
			SampledAt:            ts(m.SampledAt),
		})
	}
	return out
}
