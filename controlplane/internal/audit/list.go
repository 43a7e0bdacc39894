package audit

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Handlers implements the AdminAudit operations.
type Handlers struct {
	Pool    *pgxpool.Pool
	Cursors pagination.Codec
}

// sortSpec is one entry of the seed's audit sort enum: the key columns in order, and the
// direction. The table is the whitelist: no client text ever reaches ORDER BY.
type sortSpec struct {
	keys []string
	desc bool
}

var sorts = map[api.AuditSortOrder]sortSpec{
	api.AuditSortOrderOccurredAtDesc: {[]string{"occurred_at"}, true},
	api.AuditSortOrderOccurredAtAsc:  {[]string{"occurred_at"}, false},
	api.AuditSortOrderActionAsc:      {[]string{"action"}, false},
	api.AuditSortOrderActionDesc:     {[]string{"action"}, true},
	api.AuditSortOrderResultAsc:      {[]string{"result"}, false},
	api.AuditSortOrderResultDesc:     {[]string{"result"}, true},
	api.AuditSortOrderTargetAsc:      {[]string{"target_type", "coalesce(target_id, '')"}, false},
	api.AuditSortOrderTargetDesc:     {[]string{"target_type", "coalesce(target_id, '')"}, true},
}

// position is a cursor's place: the sort key values of the last row (as text) and its id.
type position struct {
	Keys []string  `json:"k"`
	ID   uuid.UUID `json:"i"`
}

func (h *Handlers) ListAuditEvents(ctx context.Context, req api.ListAuditEventsRequestObject) (api.ListAuditEventsResponseObject, error) {
	p, ok := principal.From(ctx)
	if !ok || !p.Can(principal.CapAuditRead) {
		return nil, apierr.New(apierr.AdminRequired, "reading the audit log needs the platform.audit.read capability")
	}
	sortName := api.AuditSortOrderOccurredAtDesc
	if req.Params.Sort != nil {
		sortName = *req.Params.Sort
	}
	spec, ok := sorts[sortName]
	if !ok {
		return nil, apierr.Validation("sort", "unknown sort %q", sortName)
	}
	size := pagination.Size(req.Params.PageSize)

	var where []string
	var args []any
	arg := func(v any) string { args = append(args, v); return fmt.Sprintf("$%d", len(args)) }
	if req.Params.Action != nil {
		where = append(where, "action = "+arg(*req.Params.Action))
	}
	if req.Params.TenantID != nil {
		where = append(where, "tenant_id = "+arg(*req.Params.TenantID))
	}
	if req.Params.Result != nil {
		where = append(where, "result = "+arg(string(*req.Params.Result)))
	}
	textKeys := make([]string, len(spec.keys))
	for i, k := range spec.keys {
		textKeys[i] = keyText(k)
	}
	if req.Params.Cursor != nil {
		var pos position
		if err := h.Cursors.Decode(*req.Params.Cursor, string(sortName), &pos); err != nil {
			return nil, err
		}
		if len(pos.Keys) != len(spec.keys) {
			return nil, apierr.New(apierr.InvalidRequest, "cursor is not valid").With("field", "cursor")
		}
		placeholders := make([]string, 0, len(pos.Keys)+1)
		for _, v := range pos.Keys {
			placeholders = append(placeholders, arg(v))
		}
		placeholders = append(placeholders, arg(pos.ID))
		op := ">"
		if spec.desc {
			op = "<"
		}
		where = append(where, fmt.Sprintf("(%s, id) %s (%s)", strings.Join(textKeys, ", "), op, strings.Join(placeholders, ", ")))
	}
	dir := "ASC"
	if spec.desc {
		dir = "DESC"
	}
	order := make([]string, 0, len(textKeys)+1)
	for _, k := range textKeys {
		order = append(order, k+" "+dir)
	}
	order = append(order, "id "+dir)
	q := `SELECT id, occurred_at, actor_type, actor_user_id, tenant_id, project_id, action, target_type,
	             target_id, result, correlation_id, metadata, ` + strings.Join(textKeys, ", ") + `
	      FROM audit_events`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY " + strings.Join(order, ", ") + " LIMIT " + arg(size+1)

	rows, err := h.Pool.Query(ctx, q, args...)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	defer rows.Close()
	items := make([]api.AuditEvent, 0, size)
	var last position
	more := false
	for rows.Next() {
		var (
			ev                     api.AuditEvent
			actor, tenant, project uuid.NullUUID
			meta                   []byte
			actorType, result      string
			keys                   = make([]string, len(textKeys))
			dest                   []any
			occurredAt             time.Time
		)
		dest = append(dest, &ev.ID, &occurredAt, &actorType, &actor, &tenant, &project, &ev.Action, &ev.TargetType,
			&ev.TargetID, &result, &ev.CorrelationID, &meta)
		for i := range keys {
			dest = append(dest, &keys[i])
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, apierr.Internal(err)
		}
		if len(items) == size {
			more = true // the extra row only says there is a next page
			break
		}
		ev.OccurredAt = occurredAt.UTC()
		ev.ActorType = api.AuditActorType(actorType)
		ev.Result = api.AuditResult(result)
		ev.ActorUserID = uuidPtr(actor)
		ev.TenantID = uuidPtr(tenant)
		ev.ProjectID = uuidPtr(project)
		ev.Metadata = map[string]any{}
		_ = json.Unmarshal(meta, &ev.Metadata)
		items = append(items, ev)
		last = position{Keys: keys, ID: ev.ID}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, apierr.Internal(err)
	}
	page := api.Pagination{PageSize: size}
	if more {
		cur, err := h.Cursors.Encode(string(sortName), last)
		if err != nil {
			return nil, apierr.Internal(err)
		}
		page.NextCursor = &cur
	}
	return api.ListAuditEvents200JSONResponse{Body: api.AuditEventListResponse{Items: items, Pagination: page}}, nil
}

// keyText renders a sort key as text so one cursor shape serves every sort; the
// timestamp is rendered with microseconds in UTC so text order equals time order.
func keyText(col string) string {
	if col == "occurred_at" {
		return `to_char(occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US')`
	}
	return col
}

func uuidPtr(n uuid.NullUUID) *uuid.UUID {
	if !n.Valid {
		return nil
	}
	return &n.UUID
}
