package nodes

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/fleet"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes/nodesdb"
	"github.com/gantry-gpu/gantry/shared/nodetoken"
)

// ErrUnknownNode is returned by the Directory methods for a node that does not exist
// (deleted while its tunnel was up).
var ErrUnknownNode = errors.New("nodes: unknown node")

// ErrInvalidInventory is returned by NodeConnected for a report outside the limits.
var ErrInvalidInventory = errors.New("nodes: inventory report out of limits")

// dummyHash is compared against when a node has no live token, so that "no token" and
// "wrong token" cost the same.
var dummyHash = nodetoken.Hash("gnt_00000000000000000000000000000000_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")

// AuthenticateNode implements fleet.Directory: the node a well-formed, live token
// belongs to, compared in constant time; fleet.ErrUnauthenticated otherwise.
func (s *Service) AuthenticateNode(ctx context.Context, token string) (uuid.UUID, error) {
	nodeID, err := nodetoken.Parse(token)
	if err != nil {
		return uuid.Nil, fleet.ErrUnauthenticated
	}
	row, err := s.read(ctx).LiveNodeToken(ctx, nodeID)
	if errors.Is(err, pgx.ErrNoRows) {
		nodetoken.Verify(token, dummyHash)
		return uuid.Nil, fleet.ErrUnauthenticated
	}
	if err != nil {
		return uuid.Nil, fmt.Errorf("node token lookup: %w", err)
	}
	if !nodetoken.Verify(token, row.TokenHash) {
		return uuid.Nil, fleet.ErrUnauthenticated
	}
	return nodeID, nil
}

// NodeStatus implements fleet.Directory. The row is written only when the status
// changes (status, status_changed_at and last_seen_at move together), and the change
// enqueues node.online / node.offline in the same transaction. A repeated report writes
// nothing.
func (s *Service) NodeStatus(ctx context.Context, nodeID uuid.UUID, online bool, at time.Time) error {
	status := StatusOffline
	if online {
		status = StatusOnline
	}
	if at.IsZero() {
		at = s.now()
	}
	at = at.UTC()
	if !online {
		s.telemetry.forget(nodeID)
	}
	return db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		_, err := nodesdb.New(tx).SetNodeStatus(ctx, nodesdb.SetNodeStatusParams{ID: nodeID, Status: status, StatusChangedAt: &at})
		if errors.Is(err, pgx.ErrNoRows) {
			// Unchanged, or no such node: tell which only when it matters.
			if _, gerr := nodesdb.New(tx).GetNode(ctx, nodeID); errors.Is(gerr, pgx.ErrNoRows) {
				return ErrUnknownNode
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("node status: %w", err)
		}
		return s.event(ctx, tx, "node."+status, nodeID, map[string]any{"at": at.Format(time.RFC3339Nano)})
	})
}

// NodeConnected implements fleet.Directory: it records the agent's identity and GPU
// inventory from a hello, writing only what differs from what is stored. The common
// reconnect (nothing changed) costs two reads and no transaction.
func (s *Service) NodeConnected(ctx context.Context, nodeID uuid.UUID, inv fleet.Inventory, at time.Time) error {
	if err := checkInventory(inv); err != nil {
		return err
	}
	q := s.read(ctx)
	node, err := q.GetNode(ctx, nodeID)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrUnknownNode
	}
	if err != nil {
		return fmt.Errorf("load node: %w", err)
	}
	gpus, err := q.NodeGPUs(ctx, nodeID)
	if err != nil {
		return fmt.Errorf("load gpus: %w", err)
	}
	if !identityDiffers(node, inv) && inventoryDiff(gpus, inv.GPUs).empty() {
		return nil
	}
	return db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		qt := nodesdb.New(tx)
		node, err := qt.LockNode(ctx, nodeID)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrUnknownNode
		}
		if err != nil {
			return fmt.Errorf("lock node: %w", err)
		}
		gpus, err := qt.NodeGPUs(ctx, nodeID)
		if err != nil {
			return fmt.Errorf("load gpus: %w", err)
		}
		meta := map[string]any{}
		if identityDiffers(node, inv) {
			if _, err := qt.SetNodeIdentity(ctx, nodesdb.SetNodeIdentityParams{
				ID: nodeID, Hostname: nonEmpty(inv.Hostname), AgentVersion: nonEmpty(inv.AgentVersion),
			}); err != nil {
				return fmt.Errorf("node identity: %w", err)
			}
			meta["agent_version"], meta["hostname"] = inv.AgentVersion, inv.Hostname
		}
		d := inventoryDiff(gpus, inv.GPUs)
		for _, g := range d.upsert {
			if err := qt.UpsertGPU(ctx, nodesdb.UpsertGPUParams{
				NodeID: nodeID, GpuUuid: g.UUID, GpuIndex: int32(g.Index), Model: g.Model,
				MemoryBytes: int64(g.MemoryBytes), PciBusID: g.PCIBusID, MigEnabled: g.MIGEnabled,
				DriverVersion: g.DriverVersion, CudaVersion: g.CUDAVersion,
			}); err != nil {
				return fmt.Errorf("upsert gpu: %w", err)
			}
		}
		if len(d.remove) > 0 {
			if _, err := qt.DeleteGPUs(ctx, nodesdb.DeleteGPUsParams{NodeID: nodeID, GpuUuids: d.remove}); err != nil {
				return fmt.Errorf("delete gpus: %w", err)
			}
		}
		if len(meta) == 0 && d.empty() {
			return nil // another hello got here first
		}
		meta["gpus_added"], meta["gpus_changed"], meta["gpus_removed"] = d.added, len(d.upsert)-d.added, len(d.remove)
		meta["gpu_count"] = len(inv.GPUs)
		if err := s.Audit.Record(ctx, tx, audit.Entry{
			Action: "node.inventory.update", TargetType: "node", TargetID: nodeID.String(),
			ActorType: audit.ActorNode, Metadata: meta,
		}); err != nil {
			return err
		}
		return s.event(ctx, tx, "node.inventory_changed", nodeID, map[string]any{"gpu_count": len(inv.GPUs)})
	})
}

func checkInventory(inv fleet.Inventory) error {
	if len(inv.GPUs) > MaxGPUsPerNode || len(inv.AgentVersion) > 64 || len(inv.Hostname) > 253 {
		return ErrInvalidInventory
	}
	seen := make(map[string]bool, len(inv.GPUs))
	for _, g := range inv.GPUs {
		if g.UUID == "" || len(g.UUID) > 128 || seen[g.UUID] || g.Index < 0 || g.Index > 1023 ||
			g.Model == "" || len(g.Model) > 128 || len(g.PCIBusID) > 64 || len(g.DriverVersion) > 64 ||
			len(g.CUDAVersion) > 32 || g.MemoryBytes > math.MaxInt64 {
			return ErrInvalidInventory
		}
		seen[g.UUID] = true
	}
	return nil
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func identityDiffers(n nodesdb.Node, inv fleet.Inventory) bool {
	return !eqPtr(n.Hostname, nonEmpty(inv.Hostname)) || !eqPtr(n.AgentVersion, nonEmpty(inv.AgentVersion))
}

func eqPtr(a, b *string) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

type gpuDiff struct {
	upsert []fleet.GPU
	added  int
	remove []string
}

func (d gpuDiff) empty() bool { return len(d.upsert) == 0 && len(d.remove) == 0 }

func inventoryDiff(stored []nodesdb.NodeGpu, reported []fleet.GPU) gpuDiff {
	var d gpuDiff
	byUUID := make(map[string]nodesdb.NodeGpu, len(stored))
	for _, g := range stored {
		byUUID[g.GpuUuid] = g
	}
	for _, g := range reported {
		old, ok := byUUID[g.UUID]
		switch {
		case !ok:
			d.upsert = append(d.upsert, g)
			d.added++
		case old.GpuIndex != int32(g.Index) || old.Model != g.Model || old.MemoryBytes != int64(g.MemoryBytes) ||
			old.PciBusID != g.PCIBusID || old.MigEnabled != g.MIGEnabled || old.DriverVersion != g.DriverVersion ||
			old.CudaVersion != g.CUDAVersion:
			d.upsert = append(d.upsert, g)
		}
		delete(byUUID, g.UUID)
	}
	for id := range byUUID {
		d.remove = append(d.remove, id)
	}
	slices.Sort(d.remove)
	return d
}
