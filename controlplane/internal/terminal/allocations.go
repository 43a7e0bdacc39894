package terminal

import (
	"context"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/allocations"
)

// Allocation is what the terminal needs of an allocation.
type Allocation struct {
	ID        uuid.UUID
	TenantID  uuid.UUID
	ProjectID uuid.UUID
	NodeID    uuid.UUID
	Status    string
}

// Allocations loads an allocation of a project; one of another project is the
// allocations feature's allocation_not_found.
type Allocations interface {
	Allocation(ctx context.Context, projectID, id uuid.UUID) (Allocation, error)
}

// AllocationsService adapts *allocations.Service.
type AllocationsService struct{ Svc *allocations.Service }

// Allocation implements Allocations.
func (a AllocationsService) Allocation(ctx context.Context, projectID, id uuid.UUID) (Allocation, error) {
	al, err := a.Svc.Get(ctx, projectID, id)
	if err != nil {
		return Allocation{}, err
	}
	return Allocation{ID: al.ID, TenantID: al.TenantID, ProjectID: al.ProjectID, NodeID: al.NodeID, Status: al.Status}, nil
}

// running reports whether a terminal may be opened into an allocation of this status:
// the workload is up (idle only means its GPUs are quiet).
func running(status string) bool { return status == "active" || status == "idle" }
