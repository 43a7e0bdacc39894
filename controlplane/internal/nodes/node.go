package nodes

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes/nodesdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes/probe"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Connectivity statuses (persisted by the fabric through NodeStatus).
const (
	StatusPending = "pending" // created, never connected
	StatusOnline  = "online"
	StatusOffline = "offline"
)

var (
	nameRE   = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	regionRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,63}$`)
)

// Node is a node record with a summary of its GPUs.
type Node struct {
	nodesdb.Node
	GPUs []GPUCount
}

// GPUCount is how many GPUs of one model a node has.
type GPUCount struct {
	Model string
	Count int
}

// Spec is what an admin gives to create a node.
type Spec struct {
	Name      string
	Address   string
	ProbePort *int
	Region    *string
	// Labels are `key=value` pairs, given only by a MAAS onboarding (its profile's).
	Labels []string
}

// Patch changes some fields of a node; nil leaves a field as it is.
type Patch struct {
	Name      *string
	Address   *string
	ProbePort *int
	Region    *string
}

// Page is one page of nodes by id; More says whether nodes follow.
type Page struct {
	Items []Node
	More  bool
}

func validateName(name string) error {
	if !nameRE.MatchString(name) {
		return apierr.Validation("name", "name must be a DNS label: lowercase letters, digits and inner hyphens, 1 to 63 characters").
			With("reason", "invalid_name")
	}
	return nil
}

func validateRegion(r *string) error {
	if r != nil && !regionRE.MatchString(*r) {
		return apierr.Validation("region", "region must be lowercase letters, digits and hyphens").With("reason", "invalid_region")
	}
	return nil
}

// labelRE is the profile's label pattern (openapi MaasProfileCreate.labels): the node
// takes its labels from the profile, so the two must accept the same strings.
var labelRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._/-]{0,62}=[A-Za-z0-9._-]{0,63}$`)

// maxLabels is the profile's bound, kept by the nodes table as well.
const maxLabels = 32

func validateLabels(ls []string) error {
	if len(ls) > maxLabels {
		return apierr.Validation("labels", "at most %d labels", maxLabels).With("reason", "too_many_labels")
	}
	for _, l := range ls {
		if !labelRE.MatchString(l) {
			return apierr.Validation("labels", "label %q is not key=value", l).With("reason", "invalid_label")
		}
	}
	return nil
}

func (s *Service) port(p *int) (int, error) {
	if p == nil {
		return s.Config.ProbePort, nil
	}
	if *p < 1 || *p > 65535 {
		return 0, apierr.Validation("probe_port", "probe_port must be between 1 and 65535").With("reason", "out_of_range")
	}
	return *p, nil
}

// probeAddress runs the probe and turns a refusal into the contract's errors: a denied
// target is 400 invalid_request (probe_target_denied), something that is not an address
// 422. No connection is made in either case.
func (s *Service) probeAddress(ctx context.Context, address string, port int) (probe.Result, error) {
	res, err := s.Prober.Probe(ctx, address, uint16(port))
	var denied *probe.DeniedError
	switch {
	case errors.As(err, &denied):
		return res, apierr.New(apierr.InvalidRequest, "the node address is not an allowed probe target").
			With("field", "address").With("reason", "probe_target_denied").With("target_reason", denied.Reason).
			WithStatus(400)
	case errors.Is(err, probe.ErrInvalidTarget):
		return res, apierr.Validation("address", "address must be an IP address or a host name").With("reason", "invalid_address")
	case err != nil:
		return res, fmt.Errorf("probe: %w", err)
	}
	return res, nil
}

func probeColumns(r probe.Result) (at *time.Time, reachable pgtype.Bool, latency pgtype.Int8, errText *string) {
	at = ptr(r.At.UTC())
	reachable = pgtype.Bool{Bool: r.Reachable, Valid: true}
	if r.Reachable {
		latency = pgtype.Int8{Int64: r.Latency.Microseconds(), Valid: true}
	}
	if r.Error != "" {
		errText = ptr(r.Error)
	}
	return
}

func alreadyExists(err error) error {
	return apierr.New(apierr.NodeAlreadyExists, "a node with this name or address already exists").Wrap(err)
}

// Create probes the address (a denied target is refused before anything is stored; an
// unreachable one is stored with its probe result: the host may not be up yet) and
// stores the node.
func (s *Service) Create(ctx context.Context, spec Spec) (Node, error) {
	if err := validateName(spec.Name); err != nil {
		return Node{}, err
	}
	if err := validateRegion(spec.Region); err != nil {
		return Node{}, err
	}
	if err := validateLabels(spec.Labels); err != nil {
		return Node{}, err
	}
	labels := spec.Labels
	if labels == nil {
		labels = []string{} // the column is NOT NULL
	}
	port, err := s.port(spec.ProbePort)
	if err != nil {
		return Node{}, err
	}
	res, err := s.probeAddress(ctx, spec.Address, port)
	if err != nil {
		return Node{}, err
	}
	at, reachable, latency, errText := probeColumns(res)
	var out nodesdb.Node
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		out, err = nodesdb.New(tx).InsertNode(ctx, nodesdb.InsertNodeParams{
			ID: s.IDs.New(), Name: spec.Name, Address: res.Target, ProbePort: int32(port), Region: spec.Region,
			LastProbeAt: at, LastProbeReachable: reachable, LastProbeLatencyUs: latency, LastProbeError: errText,
			CreatedAt: s.now(), Labels: labels,
		})
		if errors.Is(err, pgx.ErrNoRows) {
			return alreadyExists(nil)
		}
		if err != nil {
			return fmt.Errorf("insert node: %w", err)
		}
		if err := s.Audit.Record(ctx, tx, audit.Entry{
			Action: "node.create", TargetType: "node", TargetID: out.ID.String(),
			Metadata: map[string]any{"name": out.Name, "address": out.Address, "probe_port": port, "reachable": res.Reachable, "labels": labels},
		}); err != nil {
			return err
		}
		return s.event(ctx, tx, "node.created", out.ID, nil)
	})
	if err != nil {
		return Node{}, err
	}
	return Node{Node: out, GPUs: []GPUCount{}}, nil
}

// Get is one node.
func (s *Service) Get(ctx context.Context, id uuid.UUID) (Node, error) {
	n, err := s.read(ctx).GetNode(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return Node{}, apierr.NotFound(apierr.NodeNotFound, "node")
	}
	if err != nil {
		return Node{}, fmt.Errorf("get node: %w", err)
	}
	return s.view(ctx, n)
}

func (s *Service) view(ctx context.Context, n nodesdb.Node) (Node, error) {
	counts, err := s.gpuCounts(ctx, []uuid.UUID{n.ID})
	if err != nil {
		return Node{}, err
	}
	return Node{Node: n, GPUs: orEmpty(counts[n.ID])}, nil
}

func orEmpty(c []GPUCount) []GPUCount {
	if c == nil {
		return []GPUCount{}
	}
	return c
}

func (s *Service) gpuCounts(ctx context.Context, ids []uuid.UUID) (map[uuid.UUID][]GPUCount, error) {
	rows, err := s.read(ctx).GPUCounts(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("gpu counts: %w", err)
	}
	out := map[uuid.UUID][]GPUCount{}
	for _, r := range rows {
		out[r.NodeID] = append(out[r.NodeID], GPUCount{Model: r.Model, Count: int(r.Count)})
	}
	return out, nil
}

// List is a page of nodes by id.
func (s *Service) List(ctx context.Context, after uuid.UUID, limit int) (Page, error) {
	rows, err := s.read(ctx).ListNodes(ctx, nodesdb.ListNodesParams{
		After: uuid.NullUUID{UUID: after, Valid: after != uuid.Nil}, Limit: int32(limit + 1),
	})
	if err != nil {
		return Page{}, fmt.Errorf("list nodes: %w", err)
	}
	var pg Page
	if len(rows) > limit {
		rows, pg.More = rows[:limit], true
	}
	ids := make([]uuid.UUID, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	counts, err := s.gpuCounts(ctx, ids)
	if err != nil {
		return Page{}, err
	}
	pg.Items = make([]Node, 0, len(rows))
	for _, r := range rows {
		pg.Items = append(pg.Items, Node{Node: r, GPUs: orEmpty(counts[r.ID])})
	}
	return pg, nil
}

// Update applies p. A changed address or port is probed first (a denied target is
// refused). Nothing changed: nothing written, no audit row.
func (s *Service) Update(ctx context.Context, id uuid.UUID, p Patch) (Node, error) {
	if p.Name != nil {
		if err := validateName(*p.Name); err != nil {
			return Node{}, err
		}
	}
	if err := validateRegion(p.Region); err != nil {
		return Node{}, err
	}
	if p.ProbePort != nil {
		if _, err := s.port(p.ProbePort); err != nil {
			return Node{}, err
		}
	}
	cur, err := s.Get(ctx, id)
	if err != nil {
		return Node{}, err
	}
	next := cur.Node
	if p.Name != nil {
		next.Name = *p.Name
	}
	if p.Region != nil {
		next.Region = p.Region
	}
	if p.ProbePort != nil {
		next.ProbePort = int32(*p.ProbePort)
	}
	var res *probe.Result
	if p.Address != nil || p.ProbePort != nil {
		addr := cur.Address
		if p.Address != nil {
			addr = *p.Address
		}
		canonical, _, err := probe.Canonical(addr)
		if err != nil {
			return Node{}, apierr.Validation("address", "address must be an IP address or a host name").With("reason", "invalid_address")
		}
		if canonical != cur.Address || next.ProbePort != cur.ProbePort {
			r, err := s.probeAddress(ctx, addr, int(next.ProbePort))
			if err != nil {
				return Node{}, err
			}
			res, next.Address = &r, r.Target
		}
	}
	if next.Name == cur.Name && next.Address == cur.Address && next.ProbePort == cur.ProbePort && eqPtr(next.Region, cur.Region) {
		return cur, nil
	}
	var out nodesdb.Node
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := nodesdb.New(tx)
		if _, err := lockNode(ctx, q, id); err != nil {
			return err
		}
		out, err = q.UpdateNodeSpec(ctx, nodesdb.UpdateNodeSpecParams{
			ID: id, Name: next.Name, Address: next.Address, ProbePort: next.ProbePort, Region: next.Region, UpdatedAt: s.now(),
		})
		if db.IsUniqueViolation(err, "") {
			return alreadyExists(err)
		}
		if err != nil {
			return fmt.Errorf("update node: %w", err)
		}
		if res != nil {
			at, reachable, latency, errText := probeColumns(*res)
			if out, err = q.SetProbeResult(ctx, nodesdb.SetProbeResultParams{
				ID: id, LastProbeAt: at, LastProbeReachable: reachable, LastProbeLatencyUs: latency, LastProbeError: errText,
			}); err != nil {
				return fmt.Errorf("store probe result: %w", err)
			}
		}
		if err := s.Audit.Record(ctx, tx, audit.Entry{
			Action: "node.update", TargetType: "node", TargetID: id.String(),
			Metadata: map[string]any{"name": out.Name, "address": out.Address, "probe_port": out.ProbePort, "region": out.Region},
		}); err != nil {
			return err
		}
		return s.event(ctx, tx, "node.updated", id, nil)
	})
	if err != nil {
		return Node{}, err
	}
	return Node{Node: out, GPUs: cur.GPUs}, nil
}

// Delete removes the node, its tokens, inventory and telemetry, and ends its tunnel. It
// refuses (node_in_use) a node that live allocations use, and an online node that is
// still schedulable: cordon or drain it first, so no placement races the delete.
func (s *Service) Delete(ctx context.Context, id uuid.UUID) error {
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := nodesdb.New(tx)
		n, err := lockNode(ctx, q, id)
		if err != nil {
			return err
		}
		inUse, err := s.Allocations.NodeInUse(ctx, id)
		if err != nil {
			return fmt.Errorf("node in use: %w", err)
		}
		if inUse {
			return apierr.New(apierr.NodeInUse, "allocations are running on this node; drain it first").With("reason", "allocations_running")
		}
		if n.Status == StatusOnline && ScheduleState(n.ScheduleState) == Schedulable {
			return apierr.New(apierr.NodeInUse, "the node is online and schedulable; cordon or drain it first").With("reason", "node_schedulable")
		}
		if _, err := q.DeleteNode(ctx, id); err != nil {
			return fmt.Errorf("delete node: %w", err)
		}
		if err := s.Audit.Record(ctx, tx, audit.Entry{
			Action: "node.delete", TargetType: "node", TargetID: id.String(),
			Metadata: map[string]any{"name": n.Name, "address": n.Address},
		}); err != nil {
			return err
		}
		return s.event(ctx, tx, "node.deleted", id, nil)
	})
	if err != nil {
		return err
	}
	s.telemetry.forget(id)
	// The node's tokens are gone with it, so it cannot come back; a failed disconnect
	// only leaves an unauthenticated tunnel for the fabric to drop.
	_ = s.disconnect(ctx, id, "node deleted")
	return nil
}

// Probe probes the node's stored address now and records the result.
func (s *Service) Probe(ctx context.Context, id uuid.UUID) (Node, probe.Result, error) {
	cur, err := s.Get(ctx, id)
	if err != nil {
		return Node{}, probe.Result{}, err
	}
	res, err := s.probeAddress(ctx, cur.Address, int(cur.ProbePort))
	if err != nil {
		return Node{}, probe.Result{}, err
	}
	at, reachable, latency, errText := probeColumns(res)
	var out nodesdb.Node
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := nodesdb.New(tx)
		if _, err := lockNode(ctx, q, id); err != nil {
			return err
		}
		if out, err = q.SetProbeResult(ctx, nodesdb.SetProbeResultParams{
			ID: id, LastProbeAt: at, LastProbeReachable: reachable, LastProbeLatencyUs: latency, LastProbeError: errText,
		}); err != nil {
			return fmt.Errorf("store probe result: %w", err)
		}
		return s.Audit.Record(ctx, tx, audit.Entry{
			Action: "node.probe", TargetType: "node", TargetID: id.String(),
			Metadata: map[string]any{"reachable": res.Reachable, "error": res.Error, "addr": res.Addr.String()},
		})
	})
	if err != nil {
		return Node{}, probe.Result{}, err
	}
	return Node{Node: out, GPUs: cur.GPUs}, res, nil
}
