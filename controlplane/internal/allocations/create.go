package allocations

import (
	"context"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/billing"
	"github.com/gantry-gpu/gantry/controlplane/internal/catalog"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// CreateSpec is what a launch asks for.
type CreateSpec struct {
	Name      string
	SKU       string
	Region    string      // "" = any available region of the SKU
	KeyIDs    []uuid.UUID // empty = every key of the caller
	OSImageID uuid.NullUUID
	// Attachments are buckets to attach once the allocation is active (storage_attachments).
	Attachments []AttachmentSpec
}

// AttachmentSpec is one bucket a launch asks to attach (the attachment API's body).
type AttachmentSpec struct {
	BucketID      string
	BucketProject uuid.UUID // uuid.Nil: the allocation's project
	Mode          string
	MountPath     string // "" = the default
}

// LaunchAttachments is what a launch needs of storage attachments (storage/attach, through
// the app's adapter): Prepare checks and authorises what the launch names before
// anything is written and returns what records them in the launch's transaction;
// Active runs in the transaction that moves an allocation to active.
type LaunchAttachments interface {
	Prepare(ctx context.Context, caller *principal.Principal, proj projectctx.Project, specs []AttachmentSpec) (RecordAttachments, error)
	Active(ctx context.Context, tx pgx.Tx, allocationID uuid.UUID) error
}

// RecordAttachments stores a launch's attachments for the new allocation inside tx.
type RecordAttachments func(ctx context.Context, tx pgx.Tx, allocationID uuid.UUID) error

// Limits of the request fields (the contract says the same).
const (
	maxNameLen = 120
	maxKeys    = 32
)

func skuUnavailable(sku, region string) error {
	e := apierr.New(apierr.SKUUnavailable, "no capacity for %s right now", sku).With("sku", sku)
	if region != "" {
		e.With("region_code", region)
	}
	return e
}

// checkName validates a launch's name and key list before any other check.
func checkName(spec CreateSpec, maxLen int) (string, error) {
	name := strings.TrimSpace(spec.Name)
	if name == "" || len([]rune(spec.Name)) > maxLen {
		return "", apierr.Validation("name", "name must be 1..%d characters and not blank", maxLen).With("reason", "length")
	}
	if len(spec.KeyIDs) > maxKeys {
		return "", apierr.Validation("ssh_key_ids", "at most %d SSH keys", maxKeys).With("reason", "too_many")
	}
	return name, nil
}

// Create launches an allocation. Checks 1 to 5 of docs/allocations.md run first
// (checkLaunch), then the storage attachments it names are checked and authorised, then one transaction takes the launch's locks, runs checks 6 and 7
// under them (lockLaunch), reserves the GPUs (placeSingle) and stores the allocation as
// requested with its status event, task, outbox events and audit row. Every check runs
// in the documented order before anything is written; a refusal leaves no row, event or
// audit entry.
func (s *Service) Create(ctx context.Context, p *principal.Principal, proj projectctx.Project, spec CreateSpec) (Allocation, error) {
	name, err := checkName(spec, maxNameLen)
	if err != nil {
		return Allocation{}, err
	}
	l, err := s.checkLaunch(ctx, p, proj, spec, 1, false)
	if err != nil {
		return Allocation{}, err
	}
	recordAttachments, err := s.prepareAttachments(ctx, p, proj, spec.Attachments)
	if err != nil {
		return Allocation{}, err
	}
	var a Allocation
	err = inLaunchTx(ctx, s.Pool, func(tx pgx.Tx) error {
		cands, err := s.lockLaunch(ctx, tx, proj, l)
		if err != nil {
			return err
		}
		if a, err = s.placeSingle(ctx, tx, p, proj, l, spec, name, cands, s.now()); err != nil {
			return err
		}
		if err := s.recordCreated(ctx, tx, a, p, uuid.NullUUID{}); err != nil {
			return err
		}
		if recordAttachments != nil {
			return recordAttachments(ctx, tx, a.ID)
		}
		return nil
	})
	if err != nil {
		return Allocation{}, err
	}
	return a, nil
}

// prepareAttachments checks a launch's storage_attachments (nil when it names none).
func (s *Service) prepareAttachments(ctx context.Context, p *principal.Principal, proj projectctx.Project, specs []AttachmentSpec) (RecordAttachments, error) {
	if len(specs) == 0 {
		return nil, nil
	}
	if s.Attachments == nil {
		return nil, apierr.New(apierr.ServiceUnavailable, "storage attachments are not available")
	}
	return s.Attachments.Prepare(ctx, p, proj, specs)
}

// inLaunchTx runs a launch's writes in the request's ambient transaction when there is
// one (the idempotency layer's), else in a transaction of their own. The ambient
// transaction needs no savepoint around them: a launch that fails fails its request,
// and a request that fails rolls the ambient transaction back whole (nothing persisted),
// so the savepoint would only cost two round trips.
func inLaunchTx(ctx context.Context, pool *pgxpool.Pool, fn func(tx pgx.Tx) error) error {
	if tx, ok := db.TxFrom(ctx); ok {
		return fn(tx)
	}
	return db.InTx(ctx, pool, fn)
}

func (s *Service) concurrencyLimit() error {
	return apierr.New(apierr.AllocationConcurrencyLimit, "the project already has %d live allocations", s.Config.MaxPerProject).
		With("limit", s.Config.MaxPerProject)
}

// launchRegions are the regions a launch may be placed in: the requested one, else
// every region of the SKU; only regions whose state is available, in the catalog's order.
func launchRegions(t catalog.LaunchTerms, requested string) []string {
	var out []string
	for _, r := range t.Regions {
		if r.State != catalog.RegionAvailable || (requested != "" && r.Region != requested) {
			continue
		}
		out = append(out, r.Region)
	}
	return out
}

// hourlyRate is the hourly rate of gpus GPUs at the runway decision's unit price, in its
// currency; not priced when the decision names no price.
func hourlyRate(d billing.Decision, gpus int32) (int64, bool, error) {
	exp, known := billing.Exponent(d.Currency)
	if d.UnitPrice == "" || !known {
		return 0, false, nil
	}
	h, err := catalog.HourlyMinor(d.UnitPrice, gpus, exp)
	if err != nil {
		return 0, false, err
	}
	return h, true, nil
}
