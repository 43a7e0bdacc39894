// Package audit owns the append-only audit log: one Record call per persisted change,
// made with the transaction of that change, so an audit row exists exactly when the
// change committed. It never records secrets, keystrokes or request bodies: callers pass
// identifiers and small metadata.
package audit

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit/auditdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/correlation"
	"github.com/gantry-gpu/gantry/shared/ids"
)

// Results.
const (
	Success = "success"
	Failure = "failure"
)

// Actor types.
const (
	ActorUser    = "user"
	ActorService = "service"
	ActorSystem  = "system"
	ActorNode    = "node"
)

// Entry is one audited change. Actor and correlation id come from the context.
type Entry struct {
	Action     string // e.g. "project.create"
	TargetType string // e.g. "project"
	TargetID   string
	TenantID   uuid.UUID // uuid.Nil when none
	ProjectID  uuid.UUID // uuid.Nil when none
	Result     string    // Success when empty
	Metadata   map[string]any
	// ActorType overrides the actor taken from the context (system jobs, nodes).
	ActorType string
}

// Log writes audit rows.
type Log struct {
	Clock clock.Clock
	IDs   ids.Source
}

// Record inserts e with tx. The caller's principal (if any) is the actor.
func (l *Log) Record(ctx context.Context, tx pgx.Tx, e Entry) error {
	meta := e.Metadata
	if meta == nil {
		meta = map[string]any{}
	}
	metaJSON, err := json.Marshal(meta)
	if err != nil {
		return fmt.Errorf("audit metadata: %w", err)
	}
	actorType, actor := e.ActorType, uuid.NullUUID{}
	if p, ok := principal.From(ctx); ok {
		actor = uuid.NullUUID{UUID: p.UserID, Valid: true}
		if actorType == "" {
			actorType = ActorUser
		}
	}
	if actorType == "" {
		actorType = ActorSystem
	}
	result := e.Result
	if result == "" {
		result = Success
	}
	corr := correlation.ID(ctx)
	if corr == "" {
		corr = "system"
	}
	var target *string
	if e.TargetID != "" {
		target = &e.TargetID
	}
	return auditdb.New(tx).InsertAuditEvent(ctx, auditdb.InsertAuditEventParams{
		ID:            l.IDs.New(),
		OccurredAt:    l.Clock.Now(),
		ActorType:     actorType,
		ActorUserID:   actor,
		TenantID:      nullable(e.TenantID),
		ProjectID:     nullable(e.ProjectID),
		Action:        e.Action,
		TargetType:    e.TargetType,
		TargetID:      target,
		Result:        result,
		CorrelationID: corr,
		Metadata:      metaJSON,
	})
}

func nullable(id uuid.UUID) uuid.NullUUID { return uuid.NullUUID{UUID: id, Valid: id != uuid.Nil} }
