package sshkeys

import (
	"context"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/proto/api"
)

// Handlers implements the SshKeys slice of api.StrictServerInterface. Every operation
// acts on the caller's own keys only.
type Handlers struct {
	Svc     *Service
	Cursors pagination.Codec
}

// NewHandlers returns the handlers over svc.
func NewHandlers(svc *Service, cursors pagination.Codec) *Handlers {
	return &Handlers{Svc: svc, Cursors: cursors}
}

const sortKeys = "ssh_keys.id"

func apiKey(k Key) api.SSHKey {
	bits := int(k.Bits)
	return api.SSHKey{
		ID: k.ID, Name: k.Name, PublicKey: k.PublicKey, Fingerprint: k.Fingerprint,
		KeyType: k.KeyType, Bits: &bits, CreatedAt: k.CreatedAt,
	}
}

// ListSSHKeys implements GET /api/v1/ssh-keys.
func (h *Handlers) ListSSHKeys(ctx context.Context, req api.ListSSHKeysRequestObject) (api.ListSSHKeysResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	var after uuid.UUID
	if err := h.Cursors.DecodeAfter(req.Params.Cursor, sortKeys, &after); err != nil {
		return nil, err
	}
	size := pagination.Size(req.Params.PageSize)
	pg, err := h.Svc.List(ctx, p.UserID, after, size)
	if err != nil {
		return nil, err
	}
	out := api.SSHKeyListResponse{Items: make([]api.SSHKey, 0, len(pg.Items)), Pagination: api.Pagination{PageSize: size}}
	for _, k := range pg.Items {
		out.Items = append(out.Items, apiKey(k))
	}
	if pg.More {
		if out.Pagination.NextCursor, err = h.Cursors.Next(true, sortKeys, pg.Items[len(pg.Items)-1].ID); err != nil {
			return nil, err
		}
	}
	return api.ListSSHKeys200JSONResponse{Body: out}, nil
}

// CreateSSHKey implements POST /api/v1/ssh-keys.
func (h *Handlers) CreateSSHKey(ctx context.Context, req api.CreateSSHKeyRequestObject) (api.CreateSSHKeyResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	k, err := h.Svc.Create(ctx, p.UserID, p.TenantID, req.Body.Name, req.Body.PublicKey)
	if err != nil {
		return nil, err
	}
	return api.CreateSSHKey201JSONResponse{Body: apiKey(k)}, nil
}

// DeleteSSHKey implements DELETE /api/v1/ssh-keys/{key_id}.
func (h *Handlers) DeleteSSHKey(ctx context.Context, req api.DeleteSSHKeyRequestObject) (api.DeleteSSHKeyResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	if err := h.Svc.Delete(ctx, p.UserID, p.TenantID, req.KeyID); err != nil {
		return nil, err
	}
	return api.DeleteSSHKey204Response{}, nil
}
