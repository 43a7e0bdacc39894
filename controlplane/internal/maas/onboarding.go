package maas

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/canonical/gomaasclient/client"
	"github.com/canonical/gomaasclient/entity"
	"github.com/canonical/gomaasclient/entity/node"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/nodes"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	cloudinit "github.com/gantry-gpu/gantry/deploy/cloud-init"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Constraints are what MAAS's allocate matches when no system id is given.
type Constraints struct {
	Tags      []string `json:"tags,omitempty"`
	NotTags   []string `json:"not_tags,omitempty"`
	Pool      string   `json:"pool,omitempty"`
	Zone      string   `json:"zone,omitempty"`
	CPUCount  int      `json:"cpu_count,omitempty"`
	MemoryMiB int64    `json:"memory_mib,omitempty"`
}

// OnboardingSpec is an onboarding to start.
type OnboardingSpec struct {
	SiteID      uuid.UUID
	ProfileID   uuid.UUID
	SystemID    *string
	Constraints *Constraints
	NodeName    *string
}

// Onboarding is an onboarding as stored.
type Onboarding struct {
	ID            uuid.UUID
	SiteID        uuid.UUID
	ProfileID     uuid.UUID
	Recipe        Profile
	SystemID      *string
	Constraints   *Constraints
	NodeName      *string
	Hostname      *string
	NodeID        *uuid.UUID
	State         string
	CurrentStep   *string
	FailureReason *string
	Steps         []Step
	CreatedAt     time.Time
	UpdatedAt     time.Time
	FinishedAt    *time.Time
	sealedToken   []byte
}

const onboardingCols = `id, site_id, profile_id, recipe, system_id, constraints, node_name, hostname, node_id, state, current_step,
	failure_reason, steps, created_at, updated_at, finished_at, enrollment_sealed`

func scanOnboarding(row pgx.Row) (Onboarding, error) {
	var o Onboarding
	var recipe, cons, steps []byte
	var nodeID uuid.NullUUID
	err := row.Scan(&o.ID, &o.SiteID, &o.ProfileID, &recipe, &o.SystemID, &cons, &o.NodeName, &o.Hostname, &nodeID, &o.State,
		&o.CurrentStep, &o.FailureReason, &steps, &o.CreatedAt, &o.UpdatedAt, &o.FinishedAt, &o.sealedToken)
	if err != nil {
		return o, err
	}
	if nodeID.Valid {
		o.NodeID = &nodeID.UUID
	}
	if err := json.Unmarshal(recipe, &o.Recipe); err != nil {
		return o, err
	}
	if len(cons) > 0 && string(cons) != "null" {
		o.Constraints = &Constraints{}
		if err := json.Unmarshal(cons, o.Constraints); err != nil {
			return o, err
		}
	}
	return o, json.Unmarshal(steps, &o.Steps)
}

// GetOnboarding is one onboarding.
func (s *Service) GetOnboarding(ctx context.Context, id uuid.UUID) (Onboarding, error) {
	o, err := scanOnboarding(db.Querier(ctx, s.Pool).QueryRow(ctx, `SELECT `+onboardingCols+` FROM maas_onboardings WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return o, wfNotFound(KindOnboarding)
	}
	if err != nil {
		return o, fmt.Errorf("get onboarding: %w", err)
	}
	return o, nil
}

func machineUnavailable(format string, args ...any) error {
	return apierr.New(apierr.InvalidRequest, format, args...).With("reason", "maas_machine_unavailable").WithStatus(409)
}

// onboardable are the MAAS statuses a machine may be onboarded from.
var onboardable = map[node.Status]bool{
	node.StatusNew: true, node.StatusReady: true, node.StatusFailedCommissioning: true, node.StatusFailedTesting: true,
}

// CreateOnboarding checks the request against MAAS and starts the workflow: the row and
// the job of its first step commit together. Of concurrent onboardings of one machine
// the unique index lets exactly one in.
func (s *Service) CreateOnboarding(ctx context.Context, spec OnboardingSpec) (Onboarding, error) {
	if (spec.SystemID == nil) == (spec.Constraints == nil) {
		return Onboarding{}, apierr.Validation("system_id", "give exactly one of system_id and constraints")
	}
	site, err := s.GetSite(ctx, spec.SiteID)
	if err != nil {
		return Onboarding{}, err
	}
	prof, err := s.GetProfile(ctx, spec.ProfileID)
	if err != nil {
		if ae, ok := apierr.As(err); ok && ae.HTTPStatus() == 404 {
			return Onboarding{}, apierr.Validation("profile_id", "profile not found").With("reason", "profile_not_found")
		}
		return Onboarding{}, err
	}
	if spec.NodeName != nil && !nodeNameRE.MatchString(*spec.NodeName) {
		return Onboarding{}, apierr.Validation("node_name", "node_name must be a DNS label")
	}
	var hostname *string
	if spec.SystemID != nil {
		var m *entity.Machine
		var devs []entity.NodeDevice
		err := s.withClient(ctx, site.ID, func(c *client.Client) error {
			var err error
			if m, err = c.Machine.Get(*spec.SystemID); err != nil {
				return err
			}
			devs, err = c.NodeDevices.Get(*spec.SystemID, &entity.NodeDeviceParams{HardwareType: "gpu"})
			return err
		})
		if err != nil {
			if ae, ok := apierr.As(err); ok && ae.Details["reason"] == "maas_not_found" {
				return Onboarding{}, apierr.Validation("system_id", "MAAS has no machine %s", *spec.SystemID).With("reason", "maas_machine_not_found")
			}
			return Onboarding{}, err
		}
		if !onboardable[m.Status] {
			return Onboarding{}, machineUnavailable("machine %s is %s in MAAS; only New, Ready or failed-commissioning machines can be onboarded", *spec.SystemID, m.StatusName)
		}
		if gpus := gpusFromDevices(devs); len(gpus) > 0 {
			if ok, err := s.profileFits(ctx, prof, gpus); err != nil {
				return Onboarding{}, err
			} else if !ok {
				return Onboarding{}, apierr.Validation("profile_id", "the machine's GPUs (%s) cannot make any of the profile's SKUs", describeGPUs(gpus)).With("reason", "sku_mismatch")
			}
		}
		hostname = &m.Hostname
	}
	now := s.now()
	id := s.IDs.New()
	steps := newSteps(OnboardingSteps)
	start(steps, 0, now, s.stepTimeout(StepAllocate))
	first := StepAllocate
	r := wfRow{Kind: KindOnboarding, ID: id, State: StateRunning, CurrentStep: &first, Steps: steps}
	recipe, _ := json.Marshal(prof)
	var cons []byte
	if spec.Constraints != nil {
		cons, _ = json.Marshal(spec.Constraints)
	}
	rawSteps, _ := json.Marshal(steps)
	var createdBy *uuid.UUID
	if p, ok := principal.From(ctx); ok && p.UserID != uuid.Nil {
		createdBy = &p.UserID
	}
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO maas_onboardings (id, site_id, profile_id, recipe, system_id, constraints, node_name, hostname,
			state, current_step, steps, created_by, created_at, updated_at) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,'running',$9,$10,$11,$12,$12)`,
			id, site.ID, prof.ID, recipe, spec.SystemID, cons, spec.NodeName, hostname, first, rawSteps, createdBy, now)
		if isUnique(err) {
			return machineUnavailable("machine %s is already being onboarded", *spec.SystemID)
		}
		if err != nil {
			return fmt.Errorf("insert onboarding: %w", err)
		}
		if err := s.enqueue(ctx, tx, r); err != nil {
			return err
		}
		meta := map[string]any{"site_id": site.ID.String(), "profile_id": prof.ID.String()}
		if spec.SystemID != nil {
			meta["system_id"] = *spec.SystemID
		}
		return s.changed(ctx, tx, "maas.onboarding.create", "maas_onboarding", id.String(), "maas.onboarding.started", meta)
	})
	if err != nil {
		return Onboarding{}, err
	}
	s.Metrics.started(KindOnboarding)
	return s.GetOnboarding(ctx, id)
}

func describeGPUs(gpus []GPUCount) string {
	var parts []string
	for _, g := range gpus {
		parts = append(parts, fmt.Sprintf("%d x %s", g.Count, g.Model))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// profileFits reports whether gpus make at least one of the profile's SKUs.
func (s *Service) profileFits(ctx context.Context, p Profile, gpus []GPUCount) (bool, error) {
	for _, id := range p.SKUs {
		sku, err := s.Catalog.GetSKU(ctx, id)
		if err != nil {
			if ae, ok := apierr.As(err); ok && ae.HTTPStatus() == 404 {
				continue
			}
			return false, err
		}
		if makes(gpus, sku.GpuModel, int(sku.GpuCount)) {
			return true, nil
		}
	}
	return false, nil
}

// RetryOnboarding restarts a failed onboarding. A failure while deploying restarts at
// deploy (which releases and re-allocates a machine MAAS left in Failed deployment).
func (s *Service) RetryOnboarding(ctx context.Context, id uuid.UUID) (Onboarding, error) {
	err := s.retry(ctx, KindOnboarding, id, func(failed string) string {
		if failed == StepWaitDeployed {
			return StepDeploy
		}
		return failed
	})
	if err != nil {
		return Onboarding{}, err
	}
	return s.GetOnboarding(ctx, id)
}

// AbortOnboarding stops an unfinished onboarding; the abort job releases the machine in
// MAAS and removes the node record.
func (s *Service) AbortOnboarding(ctx context.Context, id uuid.UUID) (Onboarding, error) {
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		r, err := loadRow(ctx, tx, KindOnboarding, id, true)
		if errors.Is(err, pgx.ErrNoRows) {
			return wfNotFound(KindOnboarding)
		}
		if err != nil {
			return err
		}
		to, ok := transition(r.State, "abort")
		if !ok {
			return apierr.New(apierr.InvalidRequest, "a %s onboarding cannot be aborted", r.State).With("reason", "onboarding_state_invalid").WithStatus(409)
		}
		from := r.CurrentStep
		if i := stepIndex(r.Steps, deref(from)); i >= 0 && r.Steps[i].State == StateRunning {
			finish(r.Steps, i, StateFailed, s.now(), "aborted")
		}
		r.State = to
		abort := StepAbort
		r.CurrentStep = &abort
		if err := s.saveRow(ctx, tx, r, nil, false); err != nil {
			return err
		}
		if _, err := s.Jobs.InsertTx(ctx, tx, StepArgs{Workflow: KindOnboarding, ID: id, Step: StepAbort}, nil); err != nil {
			return err
		}
		return s.changed(ctx, tx, "maas.onboarding.abort", "maas_onboarding", id.String(), "maas.onboarding.aborting", map[string]any{"step": deref(from)})
	})
	if err != nil {
		return Onboarding{}, err
	}
	return s.GetOnboarding(ctx, id)
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// runAbort releases the machine (aborting what MAAS is doing first) and removes the node.
func (s *Service) runAbort(ctx context.Context, r wfRow) error {
	o, err := s.GetOnboarding(ctx, r.ID)
	if err != nil {
		return err
	}
	if o.SystemID != nil {
		err := s.withClient(ctx, o.SiteID, func(c *client.Client) error {
			m, err := c.Machine.Get(*o.SystemID)
			if err != nil {
				return err
			}
			switch m.Status {
			case node.StatusCommissioning, node.StatusTesting, node.StatusDeploying, node.StatusDiskErasing:
				if _, err := c.Machine.Abort(*o.SystemID, "gantry: onboarding aborted"); err != nil {
					return err
				}
				m, err = c.Machine.Get(*o.SystemID)
				if err != nil {
					return err
				}
			}
			switch m.Status {
			case node.StatusAllocated, node.StatusDeployed, node.StatusDeploying, node.StatusFailedDeployment, node.StatusReserved:
				_, err = c.Machine.Release(*o.SystemID, &entity.MachineReleaseParams{Comment: "gantry: onboarding aborted", QuickErase: true, Erase: true})
			}
			return err
		})
		if err != nil {
			s.Log.WarnContext(ctx, "maas abort: release failed; will retry", "onboarding_id", r.ID, "err", err)
			return err // River retries
		}
	}
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		cur, err := loadRow(ctx, tx, KindOnboarding, r.ID, true)
		if err != nil || cur.State != StateAborting {
			return err
		}
		if o.NodeID != nil {
			if err := s.Nodes.Delete(db.WithTx(ctx, tx), *o.NodeID); err != nil && apierr.CodeOf(err) != apierr.NodeNotFound {
				return err
			}
		}
		cur.State, _ = transition(cur.State, "aborted")
		cur.CurrentStep = nil
		if err := s.saveRow(ctx, tx, cur, nil, true); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE maas_onboardings SET enrollment_sealed = NULL WHERE id = $1`, r.ID); err != nil {
			return err
		}
		return s.changed(ctx, tx, "maas.onboarding.aborted", "maas_onboarding", r.ID.String(), "maas.onboarding.aborted", nil)
	})
	if err == nil {
		s.Metrics.outcome(KindOnboarding, StateAborted)
	}
	return err
}

// onboardingStep runs one step of onboarding id.
func (s *Service) onboardingStep(ctx context.Context, id uuid.UUID, step string) (Outcome, error) {
	o, err := s.GetOnboarding(ctx, id)
	if err != nil {
		return Outcome{}, err
	}
	switch step {
	case StepAllocate:
		return s.stepAllocate(ctx, o)
	case StepCommission:
		return s.stepCommission(ctx, o)
	case StepCreateNode:
		return s.stepCreateNode(ctx, o)
	case StepDeploy:
		return s.stepDeploy(ctx, o)
	case StepWaitDeployed:
		return s.stepWaitDeployed(ctx, o)
	case StepWaitEnrolled:
		return s.stepWaitEnrolled(ctx, o)
	case StepUncordon:
		return Outcome{Done: true, Apply: func(ctx context.Context, tx pgx.Tx) error {
			if _, err := s.Nodes.ChangeSchedule(ctx, *o.NodeID, nodes.ActionUncordon); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `UPDATE maas_onboardings SET enrollment_sealed = NULL WHERE id = $1`, o.ID)
			return err
		}}, nil
	}
	return Outcome{}, fmt.Errorf("maas: unknown onboarding step %q", step)
}

// machineFailed says why a MAAS status ends a step, or "".
func machineFailed(m *entity.Machine) string {
	switch m.Status {
	case node.StatusFailedCommissioning, node.StatusFailedTesting, node.StatusFailedDeployment, node.StatusMissing,
		node.StatusBroken, node.StatusFailedReleasing, node.StatusFailedDiskErasing:
		return fmt.Sprintf("MAAS reports the machine %s", m.StatusName)
	}
	return ""
}

func (s *Service) stepAllocate(ctx context.Context, o Onboarding) (Outcome, error) {
	var out Outcome
	err := s.withClient(ctx, o.SiteID, func(c *client.Client) error {
		if o.SystemID == nil {
			// Constraints: MAAS chooses a Ready machine (a dry run: nothing is taken yet);
			// the site's default pool, zone and tags fill what the constraints leave open.
			// The choice is recorded before anything is done to the machine, so a re-run
			// after a crash goes on with the same machine instead of taking a second one,
			// and the layout can be set while the machine is still Ready.
			cons := *o.Constraints
			if site, err := s.GetSite(ctx, o.SiteID); err == nil {
				if cons.Pool == "" && site.DefaultPool != nil {
					cons.Pool = *site.DefaultPool
				}
				if cons.Zone == "" && site.DefaultZone != nil {
					cons.Zone = *site.DefaultZone
				}
				if len(cons.Tags) == 0 {
					cons.Tags = site.DefaultTags
				}
			}
			m, err := c.Machines.Allocate(&entity.MachineAllocateParams{DryRun: true, Tags: cons.Tags, NotTags: cons.NotTags,
				Pool: cons.Pool, Zone: cons.Zone, CPUCount: cons.CPUCount, Mem: cons.MemoryMiB})
			if err != nil {
				if Classify(err) == FailConflict {
					out = fail("no machine in MAAS matches the constraints")
					return nil
				}
				return err
			}
			tag, err := s.Pool.Exec(ctx, `UPDATE maas_onboardings SET system_id = $2, hostname = $3, updated_at = $4
				WHERE id = $1 AND system_id IS NULL AND state = 'running' AND current_step = 'allocate'`, o.ID, m.SystemID, m.Hostname, s.now())
			if isUnique(err) {
				out = waiting("the machine MAAS chose is being onboarded already; choosing again")
				return nil
			}
			if err != nil {
				return err
			}
			if tag.RowsAffected() != 1 {
				return errors.New("maas: the allocate step moved on")
			}
			o.SystemID, o.Hostname = &m.SystemID, &m.Hostname
		}
		m, err := c.Machine.Get(*o.SystemID)
		if err != nil {
			return err
		}
		switch m.Status {
		case node.StatusAllocated:
			// Allocated by this step before a restart (the machine is ours: the
			// onboarding holds it through the unique index).
			out = Outcome{Done: true, Next: StepCreateNode}
		case node.StatusReady:
			if err := allocateWithLayout(c, o); err != nil {
				if Classify(err) == FailConflict {
					if o.Constraints != nil {
						// Taken between the dry run and now: let MAAS choose again.
						return s.forgetChoice(ctx, o, &out)
					}
					out = fail("MAAS refused to allocate the machine (it is in use)")
					return nil
				}
				return err
			}
			out = Outcome{Done: true, Next: StepCreateNode}
		case node.StatusNew, node.StatusFailedCommissioning, node.StatusFailedTesting, node.StatusCommissioning, node.StatusTesting:
			out = Outcome{Done: true, Reason: "the machine must be commissioned before MAAS can allocate it"}
		default:
			if o.Constraints != nil {
				// The machine MAAS chose went elsewhere before we allocated it.
				return s.forgetChoice(ctx, o, &out)
			}
			out = fail(fmt.Sprintf("machine is %s in MAAS; it cannot be allocated", m.StatusName))
		}
		return nil
	})
	return out, err
}

// forgetChoice drops the machine a constraints onboarding's dry run chose (someone else
// took it before the allocation) so that the next run lets MAAS choose again.
func (s *Service) forgetChoice(ctx context.Context, o Onboarding, out *Outcome) error {
	_, err := s.Pool.Exec(ctx, `UPDATE maas_onboardings SET system_id = NULL, hostname = NULL, updated_at = $2
		WHERE id = $1 AND state = 'running' AND current_step = 'allocate'`, o.ID, s.now())
	*out = waiting("the machine MAAS chose was taken meanwhile; choosing again")
	return err
}

func (s *Service) stepCommission(ctx context.Context, o Onboarding) (Outcome, error) {
	var out Outcome
	err := s.withClient(ctx, o.SiteID, func(c *client.Client) error {
		m, err := c.Machine.Get(*o.SystemID)
		if err != nil {
			return err
		}
		switch m.Status {
		case node.StatusNew, node.StatusFailedCommissioning, node.StatusFailedTesting:
			if o.Steps[stepIndex(o.Steps, StepCommission)].Reason != nil && m.Status != node.StatusNew {
				// We started commissioning and MAAS says it failed.
				out = fail(machineFailed(m))
				return nil
			}
			if _, err := c.Machine.Commission(*o.SystemID, &entity.MachineCommissionParams{}); err != nil {
				return err
			}
			out = waiting("commissioning in MAAS")
		case node.StatusCommissioning, node.StatusTesting:
			out = waiting("commissioning in MAAS")
		case node.StatusReady:
			devs, err := c.NodeDevices.Get(*o.SystemID, &entity.NodeDeviceParams{HardwareType: "gpu"})
			if err != nil {
				return err
			}
			gpus := gpusFromDevices(devs)
			if ok, err := s.profileFits(ctx, o.Recipe, gpus); err != nil {
				return err
			} else if !ok {
				out = fail(fmt.Sprintf("GPU mismatch: the machine has %s; the profile's SKUs need more", describeGPUs(gpus)))
				return nil
			}
			if err := allocateWithLayout(c, o); err != nil {
				if Classify(err) == FailConflict {
					out = fail("MAAS refused to allocate the machine (it is in use)")
					return nil
				}
				return err
			}
			out = done()
		case node.StatusAllocated:
			out = done()
		default:
			if r := machineFailed(m); r != "" {
				out = fail(r)
			} else {
				out = fail(fmt.Sprintf("machine is %s in MAAS during commissioning", m.StatusName))
			}
		}
		return nil
	})
	return out, err
}

var nodeNameRE = regexpMust(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// nodeName is the node's name: the one asked for, else the MAAS hostname made a DNS label.
func nodeName(o Onboarding) string {
	if o.NodeName != nil {
		return *o.NodeName
	}
	h := strings.ToLower(deref(o.Hostname))
	if i := strings.IndexByte(h, '.'); i > 0 {
		h = h[:i]
	}
	if nodeNameRE.MatchString(h) {
		return h
	}
	return "maas-" + strings.ToLower(deref(o.SystemID))
}

func (s *Service) stepCreateNode(ctx context.Context, o Onboarding) (Outcome, error) {
	var addr string
	var host string
	err := s.withClient(ctx, o.SiteID, func(c *client.Client) error {
		m, err := c.Machine.Get(*o.SystemID)
		if err != nil {
			return err
		}
		host = m.Hostname
		for _, ip := range m.IPAddresses {
			if ip != nil {
				addr = ip.String()
				break
			}
		}
		return nil
	})
	if err != nil {
		return Outcome{}, err
	}
	if addr == "" {
		addr = host
	}
	site, err := s.GetSite(ctx, o.SiteID)
	if err != nil {
		return Outcome{}, err
	}
	region := site.Region
	if o.Recipe.Region != nil {
		region = *o.Recipe.Region
	}
	return Outcome{Done: true, Apply: func(ctx context.Context, tx pgx.Tx) error {
		// The profile's labels, as the onboarding recorded it, in the same transaction as
		// the node: a node never exists without them.
		n, err := s.Nodes.Create(ctx, nodes.Spec{Name: nodeName(o), Address: addr, Region: &region, Labels: o.Recipe.Labels})
		if err != nil {
			return err
		}
		// Nothing is placed on it until the agent enrolled with the right GPUs.
		if _, err := s.Nodes.ChangeSchedule(ctx, n.ID, nodes.ActionCordon); err != nil {
			return err
		}
		// The enrollment token is issued by the deploy step, so that its lifetime
		// starts when the machine starts installing.
		_, err = tx.Exec(ctx, `UPDATE maas_onboardings SET node_id = $2, hostname = COALESCE(hostname, $3) WHERE id = $1`, o.ID, n.ID, host)
		return err
	}}, nil
}

// deployRequested marks a deploy step whose attempt has called MAAS's deploy.
const deployRequested = "deploy requested"

// userData renders the cloud-init user data (base64) for an onboarding's machine.
func (s *Service) userData(o Onboarding, token string) (string, error) {
	return cloudinit.UserData(cloudinit.Params{
		ControlPlaneURL: s.Config.ControlPlaneURL, ServerCAPEM: s.Config.ServerCAPEM, EnrollmentToken: token,
		LogGatewayURL: s.Config.LogGatewayURL, Hostname: nodeName(o),
	})
}

// issueDeployToken mints the node's one-time enrollment token (superseding any earlier
// one) and records, in the same transaction, the token (sealed) and the deploy step's
// intent: a re-run of this attempt after a crash knows a Deploying machine is its own.
func (s *Service) issueDeployToken(ctx context.Context, o Onboarding, attempt int) (string, error) {
	var token string
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		tok, err := s.Nodes.IssueEnrollmentToken(db.WithTx(ctx, tx), *o.NodeID)
		if err != nil {
			return err
		}
		sealed, err := s.seal.seal([]byte(tok.Token), "enrollment", o.ID)
		if err != nil {
			return err
		}
		i := stepIndex(o.Steps, StepDeploy)
		tag, err := tx.Exec(ctx, `UPDATE maas_onboardings SET enrollment_sealed = $2, steps = jsonb_set(steps, $3, to_jsonb($4::text)), updated_at = $5
			WHERE id = $1 AND state = 'running' AND current_step = 'deploy' AND (steps->($6::int)->>'attempts')::int = $7`,
			o.ID, sealed, []string{fmt.Sprint(i), "intent"}, deployRequested, s.now(), i, attempt)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return errors.New("maas: the deploy step moved on")
		}
		token = tok.Token
		return nil
	})
	return token, err
}

func (s *Service) stepDeploy(ctx context.Context, o Onboarding) (Outcome, error) {
	var out Outcome
	err := s.withClient(ctx, o.SiteID, func(c *client.Client) error {
		m, err := c.Machine.Get(*o.SystemID)
		if err != nil {
			return err
		}
		i := stepIndex(o.Steps, StepDeploy)
		ours := o.Steps[i].Attempts <= 1 || o.Steps[i].Intent == deployRequested
		switch m.Status {
		case node.StatusDeployed:
			out = done()
			return nil
		case node.StatusDeploying:
			if ours {
				// Deployed by this attempt before a restart: no second deploy.
				out = done()
				return nil
			}
			// A deployment left over from a failed attempt (the machine went missing
			// mid-deploy, say): stop it and deploy afresh.
			if _, err := c.Machine.Abort(*o.SystemID, "gantry: redeploy after a failed attempt"); err != nil {
				return err
			}
			out = waiting("stopping the deployment of the failed attempt")
			return nil
		case node.StatusFailedDeployment:
			// A retry: MAAS redeploys only after a release and a new allocation.
			if _, err := c.Machine.Release(*o.SystemID, &entity.MachineReleaseParams{Comment: "gantry: redeploy after a failed deployment"}); err != nil {
				return err
			}
			out = waiting("releasing the machine before deploying it again")
			return nil
		case node.StatusReleasing:
			out = waiting("releasing the machine before deploying it again")
			return nil
		case node.StatusReady:
			if err := allocateWithLayout(c, o); err != nil {
				return err
			}
		case node.StatusAllocated:
		default:
			out = fail(fmt.Sprintf("machine is %s in MAAS; it cannot be deployed", m.StatusName))
			return nil
		}
		// Configuration, not MAAS: a user data that cannot be rendered fails the step
		// (checked before a token is minted; our own words only).
		if _, err := s.userData(o, "gne_"+strings.Repeat("x", 43)); err != nil {
			out = fail("cannot render the cloud-init user data: " + err.Error())
			return nil
		}
		token, err := s.issueDeployToken(ctx, o, o.Steps[i].Attempts)
		if err != nil {
			return err
		}
		ud, err := s.userData(o, token)
		if err != nil {
			return err
		}
		if _, err := c.Machine.Deploy(*o.SystemID, &entity.MachineDeployParams{UserData: ud, DistroSeries: o.Recipe.DistroSeries,
			HWEKernel: deref(o.Recipe.HWEKernel), AgentName: "gantry", Comment: "gantry onboarding " + o.ID.String()}); err != nil {
			return err
		}
		out = done()
		return nil
	})
	return out, err
}

func (s *Service) stepWaitDeployed(ctx context.Context, o Onboarding) (Outcome, error) {
	var out Outcome
	err := s.withClient(ctx, o.SiteID, func(c *client.Client) error {
		m, err := c.Machine.Get(*o.SystemID)
		if err != nil {
			return err
		}
		switch m.Status {
		case node.StatusDeployed:
			out = done()
		case node.StatusDeploying, node.StatusAllocated:
			out = waiting("MAAS is deploying the machine")
		default:
			if r := machineFailed(m); r != "" {
				out = fail(r)
			} else {
				out = fail(fmt.Sprintf("machine is %s in MAAS while deploying", m.StatusName))
			}
		}
		return nil
	})
	return out, err
}

func (s *Service) stepWaitEnrolled(ctx context.Context, o Onboarding) (Outcome, error) {
	n, err := s.Nodes.Get(ctx, *o.NodeID)
	if err != nil {
		return Outcome{}, err
	}
	if n.EnrolledAt == nil {
		return waiting("waiting for the node agent to enroll"), nil
	}
	if len(n.GPUs) == 0 {
		return waiting("the agent enrolled; waiting for its GPU inventory"), nil
	}
	gpus := make([]GPUCount, len(n.GPUs))
	for i, g := range n.GPUs {
		gpus[i] = GPUCount{Model: g.Model, Count: g.Count}
	}
	ok, err := s.profileFits(ctx, o.Recipe, gpus)
	if err != nil {
		return Outcome{}, err
	}
	if !ok {
		return fail(fmt.Sprintf("GPU mismatch: the node reports %s, which makes none of the profile's SKUs (%s)",
			describeGPUs(gpus), strings.Join(o.Recipe.SKUs, ", "))), nil
	}
	return done(), nil
}
