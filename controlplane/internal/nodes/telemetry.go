package nodes

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/fleet"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes/nodesdb"
)

// NodeTelemetry implements fleet.Directory: it stores the latest sample per GPU, in one
// statement per report. Samples are coalesced per node on this replica: a routine report
// arriving less than Config.TelemetryMinInterval after the last stored one is dropped,
// unless it changes a GPU's health or carries XID errors, which are always stored at once
// (XID counts accumulate, so none is lost). The stored sample is therefore at most one
// interval old while the node keeps reporting. Samples for GPUs that are not in the
// node's inventory are ignored (inventory comes with the hello).
func (s *Service) NodeTelemetry(ctx context.Context, nodeID uuid.UUID, samples []fleet.GPUMetrics) error {
	if len(samples) == 0 {
		return nil
	}
	if len(samples) > MaxGPUsPerNode {
		samples = samples[:MaxGPUsPerNode]
	}
	now := s.now()
	if !s.telemetry.due(nodeID, now, s.Config.TelemetryMinInterval, samples) {
		return nil
	}
	p := nodesdb.StoreTelemetryParams{NodeID: nodeID}
	for _, m := range samples {
		at := m.SampledAt.UTC()
		if m.SampledAt.IsZero() {
			at = now
		}
		var last int64
		if n := len(m.XIDErrors); n > 0 {
			last = clampInt64(m.XIDErrors[n-1])
		}
		p.GpuUuids = append(p.GpuUuids, m.UUID)
		p.SampledAt = append(p.SampledAt, at)
		p.Utilization = append(p.Utilization, int32(min(m.UtilizationPercent, 100)))
		p.MemoryUsed = append(p.MemoryUsed, clampInt64(m.MemoryUsedBytes))
		p.Temperature = append(p.Temperature, int32(min(m.TemperatureC, math.MaxInt32)))
		p.Power = append(p.Power, int64(m.PowerMilliwatts))
		p.EccCorrected = append(p.EccCorrected, clampInt64(m.ECCErrorsCorrected))
		p.EccUncorrected = append(p.EccUncorrected, clampInt64(m.ECCErrorsUncorrect))
		p.XidCount = append(p.XidCount, int64(len(m.XIDErrors)))
		p.LastXid = append(p.LastXid, last)
		p.Healthy = append(p.Healthy, m.Healthy)
	}
	if _, err := s.read(ctx).StoreTelemetry(ctx, p); err != nil {
		return fmt.Errorf("store telemetry: %w", err)
	}
	s.telemetry.wrote(nodeID, now, samples)
	return nil
}

func clampInt64(v uint64) int64 {
	if v > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(v)
}

// coalescer remembers, per node, when telemetry was last stored and the health it said.
type coalescer struct {
	mu    sync.Mutex
	nodes map[uuid.UUID]*lastStored
}

type lastStored struct {
	at      time.Time
	healthy map[string]bool
}

func (c *coalescer) due(nodeID uuid.UUID, now time.Time, interval time.Duration, samples []fleet.GPUMetrics) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	last, ok := c.nodes[nodeID]
	if !ok || now.Sub(last.at) >= interval {
		return true
	}
	for _, m := range samples {
		h, known := last.healthy[m.UUID]
		if len(m.XIDErrors) > 0 || !known || h != m.Healthy {
			return true
		}
	}
	return false
}

func (c *coalescer) wrote(nodeID uuid.UUID, now time.Time, samples []fleet.GPUMetrics) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nodes == nil {
		c.nodes = map[uuid.UUID]*lastStored{}
	}
	h := make(map[string]bool, len(samples))
	for _, m := range samples {
		h[m.UUID] = m.Healthy
	}
	c.nodes[nodeID] = &lastStored{at: now, healthy: h}
}

func (c *coalescer) forget(nodeID uuid.UUID) {
	c.mu.Lock()
	delete(c.nodes, nodeID)
	c.mu.Unlock()
}
