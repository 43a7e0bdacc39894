package app

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations"
	"github.com/gantry-gpu/gantry/controlplane/internal/fabric"
	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/attach"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/objects"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// attachments assembles storage attachments (docs/storage.md, Attachments) over the
// storage access rule and the object store: the service (its sweep runs in Run), the
// StorageFabric server on the agents' tunnels (registered before the fabric serves),
// allocations' end hook, which detaches what an ended allocation had attached, and the
// launch's storage_attachments (launchAttachments). The
// agents' results of storage tasks reach it through the fabric's OnTaskResult.
func (a *App) attachments(store *objects.Store, cursors pagination.Codec) *attach.Handlers {
	a.Attachments = attach.New(a.Pool, a.Clock, a.IDs, attach.StorageBuckets{Svc: a.Storage}, a.Fabric, attach.Config{}, a.Log)
	a.Allocations.Ended = a.Attachments.AllocationEnded
	a.Allocations.Attachments = launchAttachments{a.Attachments}
	fs := &attach.FabricServer{Svc: a.Attachments, Objects: attach.StoreObjects{Store: store, Cursors: cursors}, NodeOf: fabric.NodeID}
	a.Fabric.RegisterService(&fabricv1.StorageFabric_ServiceDesc, fs)
	// Bulk reads skip gRPC: a raw stream per block (docs/storage.md, data path).
	a.Fabric.HandleRawStream(fabricnet.AgentStreamStorageRead, fs.ServeRawRead)
	return attach.NewHandlers(a.Attachments, cursors)
}

// launchAttachments is allocations.LaunchAttachments over the attachment service.
type launchAttachments struct{ svc *attach.Service }

var _ allocations.LaunchAttachments = launchAttachments{}

func (l launchAttachments) Prepare(ctx context.Context, caller *principal.Principal, proj projectctx.Project, specs []allocations.AttachmentSpec) (allocations.RecordAttachments, error) {
	reqs := make([]attach.AttachRequest, len(specs))
	for i, sp := range specs {
		reqs[i] = attach.AttachRequest{BucketID: sp.BucketID, BucketProject: sp.BucketProject, Mode: sp.Mode, MountPath: sp.MountPath}
	}
	plan, err := l.svc.PrepareLaunch(ctx, caller, proj.TenantID, proj.ID, reqs)
	if err != nil {
		return nil, err
	}
	return plan.Record, nil
}

func (l launchAttachments) Active(ctx context.Context, tx pgx.Tx, allocationID uuid.UUID) error {
	return l.svc.AllocationActive(ctx, tx, allocationID)
}
