package tenancy

import (
	"context"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Handlers implements the tenancy slice of api.StrictServerInterface: GetMe, the tenant
// user, department, project and member operations, and the admin tenant operations.
type Handlers struct {
	Svc     *Service
	Balance BalanceSource
	Cursors pagination.Codec
}

// NewHandlers returns the handlers over svc; balance may be ZeroBalance until billing
// exists.
func NewHandlers(svc *Service, balance BalanceSource, cursors pagination.Codec) *Handlers {
	return &Handlers{Svc: svc, Balance: balance, Cursors: cursors}
}

// projectOf is the project context the chain resolved for the {project_id} path.
func projectOf(ctx context.Context, pathID uuid.UUID) (projectctx.Project, error) {
	pc, ok := projectctx.From(ctx)
	if !ok || pc.ID != pathID {
		return projectctx.Project{}, apierr.New(apierr.InvalidRequest, "project context is missing").With("field", "project_id")
	}
	return pc, nil
}

// Cursor sorts: each listing signs its cursors under its own name, so a cursor of one
// listing is refused by another.
const (
	sortTenants     = "tenants.id"
	sortUsers       = "users.id"
	sortDepartments = "departments.id"
	sortMembers     = "members.user_id"
)

// after decodes the keyset position of cursor (uuid.Nil for the first page).
func (h *Handlers) after(cursor *string, sort string) (uuid.UUID, error) {
	var id uuid.UUID
	err := h.Cursors.DecodeAfter(cursor, sort, &id)
	return id, err
}

func pageInfo[T any](h *Handlers, sort string, pg Page[T], size int, idOf func(T) uuid.UUID) (api.Pagination, error) {
	var last uuid.UUID
	if n := len(pg.Items); n > 0 {
		last = idOf(pg.Items[n-1])
	}
	next, err := h.Cursors.Next(pg.More, sort, last)
	return api.Pagination{NextCursor: next, PageSize: size}, err
}
