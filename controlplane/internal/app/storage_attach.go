package app

import (
	"github.com/gantry-gpu/gantry/controlplane/internal/fabric"
	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/attach"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/objects"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
)

// attachments assembles storage attachments (docs/storage.md, Attachments) over the
// storage access rule and the object store: the service (its sweep runs in Run), the
// StorageFabric server on the agents' tunnels (registered before the fabric serves),
// and allocations' end hook, which detaches what an ended allocation had attached. The
// agents' results of storage tasks reach it through the fabric's OnTaskResult.
func (a *App) attachments(store *objects.Store, cursors pagination.Codec) *attach.Handlers {
	a.Attachments = attach.New(a.Pool, a.Clock, a.IDs, attach.StorageBuckets{Svc: a.Storage}, a.Fabric, attach.Config{}, a.Log)
	a.Allocations.Ended = a.Attachments.AllocationEnded
	a.Fabric.RegisterService(&fabricv1.StorageFabric_ServiceDesc, &attach.FabricServer{
		Svc: a.Attachments, Objects: attach.StoreObjects{Store: store, Cursors: cursors}, NodeOf: fabric.NodeID,
	})
	return attach.NewHandlers(a.Attachments, cursors)
}
