package catalog

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/catalog/catalogdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/outbox"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
)

// Price is the price of one usage unit in one currency under the plan in force now.
type Price struct {
	Currency    string
	UnitPrice   string // exact decimal, major units per unit (one GPU-second)
	Exponent    int    // minor-unit digits of Currency
	PlanID      uuid.UUID
	PlanVersion int32
}

// Prices answers the unit prices in force now for a tenant (uuid.Nil: no tenant, the
// default plan), by usage unit, each list ordered by currency. No plan is an empty map,
// not an error.
type Prices interface {
	UnitPrices(ctx context.Context, tenantID uuid.UUID) (map[string][]Price, error)
}

// NodeFree is how many GPUs of one model are free on one node. Only online,
// schedulable nodes count; a GPU is free when no live allocation holds it and its
// latest sample does not say unhealthy.
type NodeFree struct {
	NodeID   uuid.UUID
	Region   string // "" when the node has none
	GPUModel string
	Free     int
}

// Fleet answers the free GPUs of the fleet.
type Fleet interface {
	FreeGPUs(ctx context.Context) ([]NodeFree, error)
}

// SKUUsage tells whether live allocations use a SKU (the allocations feature implements
// it; until then NoSKUUsage says none do).
type SKUUsage interface {
	SKUInUse(ctx context.Context, sku string) (bool, error)
}

// NoSKUUsage is SKUUsage before allocations exist.
type NoSKUUsage struct{}

func (NoSKUUsage) SKUInUse(context.Context, string) (bool, error) { return false, nil }

// Service is the catalog over PostgreSQL.
type Service struct {
	Pool   *pgxpool.Pool
	Clock  clock.Clock
	IDs    ids.Source
	Audit  *audit.Log
	Outbox *outbox.Writer
	Prices Prices
	Fleet  Fleet
	Usage  SKUUsage
}

// New returns the catalog; prices and fleet may be nil (no prices, no availability).
func New(pool *pgxpool.Pool, clk clock.Clock, idSrc ids.Source, prices Prices, fleet Fleet) *Service {
	return &Service{
		Pool: pool, Clock: clk, IDs: idSrc,
		Audit:  &audit.Log{Clock: clk, IDs: idSrc},
		Outbox: &outbox.Writer{Clock: clk, IDs: idSrc},
		Prices: prices, Fleet: fleet, Usage: NoSKUUsage{},
	}
}

func (s *Service) read(ctx context.Context) *catalogdb.Queries {
	return catalogdb.New(db.Querier(ctx, s.Pool))
}

func (s *Service) now() time.Time { return s.Clock.Now().UTC() }

// changed writes the audit row and the outbox event of one admin mutation.
func (s *Service) changed(ctx context.Context, tx pgx.Tx, action, targetType, targetID string, meta map[string]any) error {
	if err := s.Audit.Record(ctx, tx, audit.Entry{Action: action, TargetType: targetType, TargetID: targetID, Metadata: meta}); err != nil {
		return err
	}
	typ := action + "d" // catalog.sku.create -> catalog.sku.created
	if action[len(action)-1] != 'e' {
		typ = action + "ed"
	}
	if _, err := s.Outbox.Enqueue(ctx, tx, outbox.Event{
		Type: typ, Subject: "gantry.events." + typ, Payload: map[string]any{targetType: targetID},
	}); err != nil {
		return fmt.Errorf("enqueue %s: %w", typ, err)
	}
	return nil
}

// Page is one page of a list; More says whether items follow.
type Page[T any] struct {
	Items []T
	More  bool
}

func page[T any](rows []T, limit int) Page[T] {
	if rows == nil {
		rows = []T{}
	}
	if len(rows) > limit {
		return Page[T]{Items: rows[:limit], More: true}
	}
	return Page[T]{Items: rows}
}
