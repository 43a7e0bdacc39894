// Package fleet holds the small vocabulary that the node-administration feature (nodes)
// and the node fabric (fabric) share: what a node reports about its GPUs, and the
// interfaces each side offers the other. Neither feature imports the other; app wires
// them together through these interfaces.
package fleet

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
)

// ErrUnauthenticated is returned by Directory.AuthenticateNode for a token that is
// malformed, unknown, revoked or rotated away. Callers must not say which.
var ErrUnauthenticated = errors.New("fleet: node token not accepted")

// GPU is one device as the agent's NVML backend sees it (inventory, changes rarely).
type GPU struct {
	Index         int
	UUID          string
	Model         string // e.g. "NVIDIA H100 80GB HBM3"
	MemoryBytes   uint64
	PCIBusID      string
	MIGEnabled    bool
	DriverVersion string
	CUDAVersion   string // e.g. "12.4"
}

// Inventory is the node's whole GPU inventory plus the agent's identity.
type Inventory struct {
	AgentVersion string
	Hostname     string
	GPUs         []GPU
}

// GPUMetrics is one telemetry sample of one GPU.
type GPUMetrics struct {
	UUID               string
	UtilizationPercent uint32
	MemoryUsedBytes    uint64
	TemperatureC       uint32
	PowerMilliwatts    uint32
	ECCErrorsCorrected uint64
	ECCErrorsUncorrect uint64
	XIDErrors          []uint64 // XID event codes seen since the previous sample
	Healthy            bool
	SampledAt          time.Time
}

// Directory is what the fabric server needs from node administration (implemented by
// package nodes over PostgreSQL).
type Directory interface {
	// AuthenticateNode verifies an opaque node bearer token (constant time) and returns
	// the node it belongs to, or ErrUnauthenticated.
	AuthenticateNode(ctx context.Context, token string) (nodeID uuid.UUID, err error)
	// NodeConnected records a hello: agent version, hostname and GPU inventory. Writes
	// only what changed.
	NodeConnected(ctx context.Context, nodeID uuid.UUID, inv Inventory, at time.Time) error
	// NodeStatus records online/offline; it writes only when the status changes.
	NodeStatus(ctx context.Context, nodeID uuid.UUID, online bool, at time.Time) error
	// NodeTelemetry stores the latest sample per GPU (implementations may coalesce).
	NodeTelemetry(ctx context.Context, nodeID uuid.UUID, samples []GPUMetrics) error
}

// Presence is where a node's tunnel lives right now, as the fabric knows it.
type Presence struct {
	NodeID        uuid.UUID
	Replica       string
	Online        bool
	LastHeartbeat time.Time
	Transport     string // "quic" or "tcp"
}

// PresenceReader answers "which nodes are connected, and when were they last heard"
// (implemented by package fabric from its JetStream KV bucket).
type PresenceReader interface {
	Presence(ctx context.Context, nodeID uuid.UUID) (Presence, bool, error)
	AllPresence(ctx context.Context) (map[uuid.UUID]Presence, error)
}

// Disconnector ends a node's tunnel on whichever replica holds it, at once (token
// revoked or rotated, node deleted). Implemented by package fabric.
type Disconnector interface {
	Disconnect(ctx context.Context, nodeID uuid.UUID, reason string) error
}

// FabricInfo is what enrollment hands to a new agent: the fabric CA (PEM) to trust and
// the address to dial. Implemented by package fabric.
type FabricInfo interface {
	CAPEM() []byte
	Addr() string
}
