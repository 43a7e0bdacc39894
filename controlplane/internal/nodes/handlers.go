package nodes

import (
	"context"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/nodes/nodesdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes/probe"
	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Handlers is this feature's slice of the generated strict-server interface.
type Handlers struct {
	Svc     *Service
	Cursors pagination.Codec
}

// NewHandlers returns the handlers over svc.
func NewHandlers(svc *Service, cursors pagination.Codec) *Handlers {
	return &Handlers{Svc: svc, Cursors: cursors}
}

const sortNodes = "nodes.id"

// node is the node authenticated by the chain (nodeBearerAuth).
func node(ctx context.Context) (*principal.Node, error) {
	n, ok := principal.NodeFrom(ctx)
	if !ok {
		return nil, apierr.New(apierr.TokenMissing, "node token required")
	}
	return n, nil
}

func (h *Handlers) page(ctx context.Context, cursor *string, size *int) (uuid.UUID, int, error) {
	var after uuid.UUID
	if err := h.Cursors.DecodeAfter(cursor, sortNodes, &after); err != nil {
		return uuid.Nil, 0, err
	}
	return after, pagination.Size(size), nil
}

func (h *Handlers) nodeList(ctx context.Context, cursor *string, size *int) (api.NodeListResponse, error) {
	after, n, err := h.page(ctx, cursor, size)
	if err != nil {
		return api.NodeListResponse{}, err
	}
	pg, err := h.Svc.List(ctx, after, n)
	if err != nil {
		return api.NodeListResponse{}, err
	}
	out := api.NodeListResponse{Items: make([]api.Node, 0, len(pg.Items)), Pagination: api.Pagination{PageSize: n}}
	for _, it := range pg.Items {
		out.Items = append(out.Items, apiNode(it))
	}
	if pg.More {
		if out.Pagination.NextCursor, err = h.Cursors.Next(true, sortNodes, pg.Items[len(pg.Items)-1].ID); err != nil {
			return out, err
		}
	}
	return out, nil
}

func apiNode(n Node) api.Node {
	out := api.Node{
		ID: n.ID, Name: n.Name, Address: n.Address, ProbePort: int(n.ProbePort), Region: n.Region,
		ScheduleState: api.NodeScheduleState(n.ScheduleState), Status: api.NodeStatus(n.Status),
		StatusChangedAt: n.StatusChangedAt, LastSeenAt: n.LastSeenAt, Hostname: n.Hostname,
		AgentVersion: n.AgentVersion, EnrolledAt: n.EnrolledAt, CreatedAt: n.CreatedAt, UpdatedAt: n.UpdatedAt,
		Gpus: make([]api.NodeGPUCount, 0, len(n.GPUs)), Labels: n.Labels,
	}
	if out.Labels == nil {
		out.Labels = []string{}
	}
	for _, g := range n.GPUs {
		out.Gpus = append(out.Gpus, api.NodeGPUCount{Model: g.Model, Count: g.Count})
	}
	out.LastProbe = storedProbe(n.Node)
	return out
}

func storedProbe(n nodesdb.Node) *api.NodeProbeResult {
	if n.LastProbeAt == nil {
		return nil
	}
	r := &api.NodeProbeResult{ProbedAt: *n.LastProbeAt, Reachable: n.LastProbeReachable.Bool, Error: n.LastProbeError}
	if n.LastProbeLatencyUs.Valid {
		r.LatencyUs = &n.LastProbeLatencyUs.Int64
	}
	return r
}

func apiProbe(r probe.Result) api.NodeProbeResult {
	out := api.NodeProbeResult{ProbedAt: r.At.UTC(), Reachable: r.Reachable}
	if r.Addr.IsValid() {
		out.Address = ptr(r.Addr.String())
	}
	if r.Reachable {
		out.LatencyUs = ptr(r.Latency.Microseconds())
	}
	if r.Error != "" {
		out.Error = ptr(r.Error)
	}
	return out
}

// ListAdminNodes implements GET /api/v1/admin/nodes.
func (h *Handlers) ListAdminNodes(ctx context.Context, req api.ListAdminNodesRequestObject) (api.ListAdminNodesResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	out, err := h.nodeList(ctx, req.Params.Cursor, req.Params.PageSize)
	if err != nil {
		return nil, err
	}
	return api.ListAdminNodes200JSONResponse{Body: out}, nil
}

// ListNodes implements GET /api/v1/nodes (platform.node.read).
func (h *Handlers) ListNodes(ctx context.Context, req api.ListNodesRequestObject) (api.ListNodesResponseObject, error) {
	p, ok := principal.From(ctx)
	if !ok {
		return nil, apierr.New(apierr.TokenMissing, "authentication required")
	}
	if !p.Can(principal.CapNodeRead) {
		return nil, apierr.Forbidden("listing nodes needs the platform.node.read capability").
			With("capability", principal.CapNodeRead)
	}
	out, err := h.nodeList(ctx, req.Params.Cursor, req.Params.PageSize)
	if err != nil {
		return nil, err
	}
	return api.ListNodes200JSONResponse{Body: out}, nil
}

// CreateNode implements POST /api/v1/admin/nodes.
func (h *Handlers) CreateNode(ctx context.Context, req api.CreateNodeRequestObject) (api.CreateNodeResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	n, err := h.Svc.Create(ctx, Spec{Name: req.Body.Name, Address: req.Body.Address, ProbePort: req.Body.ProbePort, Region: req.Body.Region})
	if err != nil {
		return nil, err
	}
	return api.CreateNode201JSONResponse{Body: apiNode(n)}, nil
}

// GetNode implements GET /api/v1/admin/nodes/{node_id}.
func (h *Handlers) GetNode(ctx context.Context, req api.GetNodeRequestObject) (api.GetNodeResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	n, err := h.Svc.Get(ctx, req.NodeID)
	if err != nil {
		return nil, err
	}
	return api.GetNode200JSONResponse{Body: apiNode(n)}, nil
}

// UpdateNode implements PATCH /api/v1/admin/nodes/{node_id}.
func (h *Handlers) UpdateNode(ctx context.Context, req api.UpdateNodeRequestObject) (api.UpdateNodeResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	n, err := h.Svc.Update(ctx, req.NodeID, Patch{Name: req.Body.Name, Address: req.Body.Address, ProbePort: req.Body.ProbePort, Region: req.Body.Region})
	if err != nil {
		return nil, err
	}
	return api.UpdateNode200JSONResponse{Body: apiNode(n)}, nil
}

// DeleteNode implements DELETE /api/v1/admin/nodes/{node_id}.
func (h *Handlers) DeleteNode(ctx context.Context, req api.DeleteNodeRequestObject) (api.DeleteNodeResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	if err := h.Svc.Delete(ctx, req.NodeID); err != nil {
		return nil, err
	}
	return api.DeleteNode204Response{}, nil
}

// ProbeNode implements POST /api/v1/admin/nodes/{node_id}/probe.
func (h *Handlers) ProbeNode(ctx context.Context, req api.ProbeNodeRequestObject) (api.ProbeNodeResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	_, res, err := h.Svc.Probe(ctx, req.NodeID)
	if err != nil {
		return nil, err
	}
	return api.ProbeNode200JSONResponse{Body: apiProbe(res)}, nil
}

// CreateNodeEnrollmentToken implements POST /api/v1/admin/nodes/{node_id}/enrollment-tokens.
func (h *Handlers) CreateNodeEnrollmentToken(ctx context.Context, req api.CreateNodeEnrollmentTokenRequestObject) (api.CreateNodeEnrollmentTokenResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	t, err := h.Svc.IssueEnrollmentToken(ctx, req.NodeID)
	if err != nil {
		return nil, err
	}
	return api.CreateNodeEnrollmentToken201JSONResponse{Body: api.NodeEnrollmentToken{
		NodeID: t.NodeID, EnrollmentToken: t.Token, ExpiresAt: t.ExpiresAt,
	}}, nil
}

func (h *Handlers) schedule(ctx context.Context, id uuid.UUID, action ScheduleAction) (api.Node, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return api.Node{}, err
	}
	n, err := h.Svc.ChangeSchedule(ctx, id, action)
	if err != nil {
		return api.Node{}, err
	}
	return apiNode(n), nil
}

// CordonNode implements POST /api/v1/admin/nodes/{node_id}/cordon.
func (h *Handlers) CordonNode(ctx context.Context, req api.CordonNodeRequestObject) (api.CordonNodeResponseObject, error) {
	n, err := h.schedule(ctx, req.NodeID, ActionCordon)
	if err != nil {
		return nil, err
	}
	return api.CordonNode200JSONResponse{Body: n}, nil
}

// UncordonNode implements POST /api/v1/admin/nodes/{node_id}/uncordon.
func (h *Handlers) UncordonNode(ctx context.Context, req api.UncordonNodeRequestObject) (api.UncordonNodeResponseObject, error) {
	n, err := h.schedule(ctx, req.NodeID, ActionUncordon)
	if err != nil {
		return nil, err
	}
	return api.UncordonNode200JSONResponse{Body: n}, nil
}

// DrainNode implements POST /api/v1/admin/nodes/{node_id}/drain.
func (h *Handlers) DrainNode(ctx context.Context, req api.DrainNodeRequestObject) (api.DrainNodeResponseObject, error) {
	n, err := h.schedule(ctx, req.NodeID, ActionDrain)
	if err != nil {
		return nil, err
	}
	return api.DrainNode200JSONResponse{Body: n}, nil
}

// RevokeNodeToken implements POST /api/v1/admin/nodes/{node_id}/token/revoke.
func (h *Handlers) RevokeNodeToken(ctx context.Context, req api.RevokeNodeTokenRequestObject) (api.RevokeNodeTokenResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	revoked, err := h.Svc.RevokeToken(ctx, req.NodeID)
	if err != nil {
		return nil, err
	}
	return api.RevokeNodeToken200JSONResponse{Body: api.NodeTokenRevokeResponse{NodeID: req.NodeID, Revoked: revoked}}, nil
}

// GetFleetTelemetry implements GET /api/v1/admin/telemetry/fleet (platform admins and
// platform.ops.read).
func (h *Handlers) GetFleetTelemetry(ctx context.Context, req api.GetFleetTelemetryRequestObject) (api.GetFleetTelemetryResponseObject, error) {
	p, ok := principal.From(ctx)
	if !ok {
		return nil, apierr.New(apierr.TokenMissing, "authentication required")
	}
	if !p.IsPlatformAdmin() && !p.Can(principal.CapOpsRead) {
		return nil, apierr.New(apierr.AdminRequired, "fleet telemetry needs a platform admin or platform.ops.read")
	}
	after, n, err := h.page(ctx, req.Params.Cursor, req.Params.PageSize)
	if err != nil {
		return nil, err
	}
	v, err := h.Svc.Fleet(ctx, after, n)
	if err != nil {
		return nil, err
	}
	out := api.FleetTelemetryResponse{
		GeneratedAt: v.GeneratedAt, Nodes: make([]api.FleetNode, 0, len(v.Nodes)),
		Totals: make([]api.FleetGPUModelTotals, 0, len(v.Totals)), Pagination: api.Pagination{PageSize: n},
	}
	for _, fn := range v.Nodes {
		an := api.FleetNode{
			NodeID: fn.ID, Name: fn.Name, Status: api.NodeStatus(fn.Status), ScheduleState: api.NodeScheduleState(fn.ScheduleState),
			AgentVersion: fn.AgentVersion, Hostname: fn.Hostname, LastHeartbeatAt: fn.LastHeartbeat,
			Gpus: make([]api.FleetGPU, 0, len(fn.GPUs)),
		}
		if fn.Transport != "" {
			an.Transport = ptr(fn.Transport)
		}
		for _, g := range fn.GPUs {
			an.Gpus = append(an.Gpus, apiFleetGPU(g))
		}
		out.Nodes = append(out.Nodes, an)
	}
	for _, t := range v.Totals {
		out.Totals = append(out.Totals, api.FleetGPUModelTotals{
			Model: t.Model, Total: t.Total, Allocated: t.Allocated, Free: t.Free, Unhealthy: t.Unhealthy, Unavailable: t.Unavailable,
		})
	}
	if v.More {
		if out.Pagination.NextCursor, err = h.Cursors.Next(true, sortNodes, v.Nodes[len(v.Nodes)-1].ID); err != nil {
			return nil, err
		}
	}
	return api.GetFleetTelemetry200JSONResponse{Body: out}, nil
}

func apiFleetGPU(g FleetGPU) api.FleetGPU {
	out := api.FleetGPU{
		UUID: g.GpuUuid, Index: int(g.GpuIndex), Model: g.Model, MemoryBytes: g.MemoryBytes, PciBusID: g.PciBusID,
		MigEnabled: g.MigEnabled, DriverVersion: g.DriverVersion, CudaVersion: g.CudaVersion, Allocated: g.Allocated,
	}
	if g.Healthy.Valid {
		out.Healthy = ptr(g.Healthy.Bool)
	}
	if g.SampledAt != nil {
		m := &api.FleetGPUMetrics{
			SampledAt: *g.SampledAt, UtilizationPercent: int(g.UtilizationPercent.Int32), MemoryUsedBytes: g.MemoryUsedBytes.Int64,
			TemperatureC: int(g.TemperatureC.Int32), PowerMilliwatts: g.PowerMilliwatts.Int64,
			EccErrorsCorrected: g.EccErrorsCorrected.Int64, EccErrorsUncorrected: g.EccErrorsUncorrected.Int64,
			XidErrorsTotal: g.XidErrorsTotal,
		}
		if g.LastXid.Valid {
			m.LastXid = ptr(g.LastXid.Int64)
		}
		out.Metrics = m
	}
	return out
}

// EnrollNode implements POST /api/v1/internal/nodes/enroll (no bearer: the enrollment
// token in the body is the credential).
func (h *Handlers) EnrollNode(ctx context.Context, req api.EnrollNodeRequestObject) (api.EnrollNodeResponseObject, error) {
	e, err := h.Svc.Enroll(ctx, req.Body.EnrollmentToken, req.Body.Hostname, req.Body.AgentVersion)
	if err != nil {
		return nil, err
	}
	return api.EnrollNode201JSONResponse{Body: api.NodeEnrollResponse{
		NodeID: e.NodeID, NodeToken: e.NodeToken, FabricCaPem: string(e.FabricCA), FabricAddr: e.FabricAddr,
	}}, nil
}

// RotateNodeToken implements POST /api/v1/internal/nodes/{node_id}/token/rotate.
func (h *Handlers) RotateNodeToken(ctx context.Context, req api.RotateNodeTokenRequestObject) (api.RotateNodeTokenResponseObject, error) {
	n, err := node(ctx)
	if err != nil {
		return nil, err
	}
	if err := sameNode(n.ID, req.NodeID); err != nil {
		return nil, err
	}
	tok, err := h.Svc.RotateToken(ctx, n.ID, n.Token)
	if err != nil {
		return nil, err
	}
	return api.RotateNodeToken200JSONResponse{Body: api.NodeTokenResponse{NodeID: n.ID, NodeToken: tok}}, nil
}

// IntrospectNodeToken implements POST /api/v1/internal/nodes/{node_id}/token/introspect.
func (h *Handlers) IntrospectNodeToken(ctx context.Context, req api.IntrospectNodeTokenRequestObject) (api.IntrospectNodeTokenResponseObject, error) {
	n, err := node(ctx)
	if err != nil {
		return nil, err
	}
	in, err := h.Svc.Introspect(ctx, n.ID, req.NodeID)
	if err != nil {
		return nil, err
	}
	return api.IntrospectNodeToken200JSONResponse{Body: api.NodeTokenIntrospection{Active: true, NodeID: in.NodeID, NodeName: in.NodeName}}, nil
}
