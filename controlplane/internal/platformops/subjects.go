package platformops

import (
	"context"
	"fmt"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
)

// Subject is one object a signal counts: ids and operator-facing classifications only
// (no tenant data-plane content: allocation names are the tenant's and stay out).
type Subject struct {
	Kind   string
	ID     string
	Label  *string
	Since  *time.Time
	Detail *string
}

// MaxSubjects is how many subjects a signal's detail lists (oldest condition first).
const MaxSubjects = 200

// subjectQueries are the detail queries of the database signals; $1 is the stuck
// provisioning cutoff (ignored by the others), $2 the limit.
var subjectQueries = map[string]string{
	"stuck_provisioning": `SELECT 'allocation', id::text, NULL::text, updated_at, status FROM allocations
		WHERE status IN ('requested', 'provisioning') AND updated_at < $1 ORDER BY updated_at, id LIMIT $2`,
	"nodes_offline": `SELECT 'node', id::text, name, status_changed_at, schedule_state FROM nodes
		WHERE status = 'offline' AND enrolled_at IS NOT NULL AND $1::timestamptz IS NOT NULL ORDER BY status_changed_at NULLS FIRST, id LIMIT $2`,
	"gpus_unhealthy": `SELECT 'gpu', g.gpu_uuid, n.name || ' gpu ' || g.gpu_index, g.sampled_at, g.model FROM node_gpus g JOIN nodes n ON n.id = g.node_id
		WHERE g.healthy = false AND $1::timestamptz IS NOT NULL ORDER BY g.sampled_at NULLS FIRST, g.gpu_uuid LIMIT $2`,
	"release_failures": `SELECT 'allocation', id::text, NULL::text, updated_at, status FROM allocations
		WHERE status = 'release_failed' AND $1::timestamptz IS NOT NULL ORDER BY updated_at, id LIMIT $2`,
	"runway_exhaustion": `SELECT 'tenant', tenant_id::text, NULL::text, blocked_at, currency FROM billing_runway_blocks
		WHERE $1::timestamptz IS NOT NULL ORDER BY blocked_at, tenant_id, currency LIMIT $2`,
}

// Subjects lists the objects signal key counts now (the first MaxSubjects).
func (s *Service) Subjects(ctx context.Context, key string) ([]Subject, error) {
	q, ok := subjectQueries[key]
	if !ok {
		if key == "log_gateway_rejections" {
			c := "node_log_gateway"
			return []Subject{{Kind: "component", ID: c, Detail: &c}}, nil
		}
		return []Subject{}, nil
	}
	now := s.Clock.Now()
	rows, err := db.Querier(ctx, s.Pool).Query(ctx, q, now.Add(-s.ProvisioningTimeout), MaxSubjects)
	if err != nil {
		return nil, fmt.Errorf("signal subjects: %w", err)
	}
	defer rows.Close()
	out := []Subject{}
	for rows.Next() {
		var sub Subject
		if err := rows.Scan(&sub.Kind, &sub.ID, &sub.Label, &sub.Since, &sub.Detail); err != nil {
			return nil, fmt.Errorf("signal subjects: %w", err)
		}
		out = append(out, sub)
	}
	return out, rows.Err()
}
