package instances

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"golang.org/x/crypto/ssh"

	"github.com/gantry-gpu/gantry/controlplane/internal/apps/instances/lifecycle"
	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/proto/fabric/apptask"
)

// Requested bootstrap SSH trust states.
const (
	TrustTrusted = apptask.TrustTrusted
	TrustRevoked = apptask.TrustRevoked
)

// ReconcileBootstrapSSH asks the instance's node for the bootstrap SSH trust of
// publicKeys (state trusted) or for none (revoked). It enqueues an app.bootstrap_ssh task
// and writes the app_instance.bootstrap_ssh.reconcile audit row only when the requested
// trust changes, or when the last task for the same request failed; the same request
// while its task is in flight, or after it succeeded, writes nothing (seed §6.2 rule 2).
// It reports whether a task was enqueued.
func (s *Service) ReconcileBootstrapSSH(ctx context.Context, instanceID uuid.UUID, state string, publicKeys []string) (bool, error) {
	if state != TrustTrusted && state != TrustRevoked {
		return false, fmt.Errorf("bootstrap ssh: unknown state %q", state)
	}
	var enqueued bool
	err := s.within(ctx, func(tx pgx.Tx) error {
		i, err := lock(ctx, tx, instanceID)
		if err != nil {
			return err
		}
		if state == TrustTrusted && lifecycle.IsFinal(i.State) {
			return nil // nothing runs to trust anything for
		}
		enqueued, err = s.reconcileTrust(ctx, tx, i, state, publicKeys)
		return err
	})
	return enqueued, err
}

func (s *Service) reconcileSSH(ctx context.Context, tx pgx.Tx, i Instance, publicKeys []string) (bool, error) {
	return s.reconcileTrust(ctx, tx, i, TrustTrusted, publicKeys)
}

func fingerprints(keys []string) ([]string, []string) {
	fps := make([]string, 0, len(keys))
	lines := make([]string, 0, len(keys))
	for _, k := range keys {
		pk, _, _, _, err := ssh.ParseAuthorizedKey([]byte(k))
		if err != nil {
			continue // a key that does not parse is not trusted
		}
		fps = append(fps, ssh.FingerprintSHA256(pk))
		lines = append(lines, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pk))))
	}
	slices.Sort(fps)
	return slices.Compact(fps), lines
}

func (s *Service) reconcileTrust(ctx context.Context, tx pgx.Tx, i Instance, state string, publicKeys []string) (bool, error) {
	fps, lines := fingerprints(publicKeys)
	if len(lines) > apptask.MaxTrustedKeys {
		// An allocation has at most 32 keys (allocations' limit); more is a caller's bug.
		return false, fmt.Errorf("bootstrap ssh: %d keys, at most %d", len(lines), apptask.MaxTrustedKeys)
	}
	if state == TrustRevoked {
		fps, lines = []string{}, []string{}
	}
	var curState string
	var curFPs []string
	var taskID uuid.UUID
	err := tx.QueryRow(ctx, `SELECT requested_state, fingerprints, task_id FROM app_instance_ssh_trust WHERE instance_id = $1 FOR UPDATE`,
		i.ID).Scan(&curState, &curFPs, &taskID)
	exists := err == nil
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return false, fmt.Errorf("load bootstrap ssh trust: %w", err)
	}
	changed := !exists || curState != state || !slices.Equal(curFPs, fps)
	if !changed {
		var finished, succeeded *bool
		if err := tx.QueryRow(ctx, `SELECT finished_at IS NOT NULL, succeeded FROM app_instance_tasks WHERE task_id = $1`,
			taskID).Scan(&finished, &succeeded); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return false, fmt.Errorf("load bootstrap ssh task: %w", err)
		}
		inFlightOrDone := finished != nil && (!*finished || (succeeded != nil && *succeeded))
		if inFlightOrDone {
			return false, nil
		}
	}
	if !exists && state == TrustRevoked {
		return false, nil // never trusted anything: nothing to revoke
	}
	payload := apptask.BootstrapSSH{AppInstanceID: i.ID.String(), AllocationID: i.AllocationID.String(), State: state, PublicKeys: lines}
	if err := payload.Validate(); err != nil {
		return false, fmt.Errorf("app.bootstrap_ssh payload of %s: %w", i.ID, err)
	}
	newTask, err := s.enqueueTask(ctx, tx, i, TaskBootstrapSSH, payload)
	if err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO app_instance_ssh_trust (instance_id, requested_state, fingerprints, task_id, updated_at)
		VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (instance_id) DO UPDATE SET requested_state = $2, fingerprints = $3, task_id = $4, updated_at = $5`,
		i.ID, state, fps, newTask, s.now()); err != nil {
		return false, fmt.Errorf("store bootstrap ssh trust: %w", err)
	}
	meta := map[string]any{"requested_state": state, "keys": len(fps), "task_id": newTask.String(),
		"trust_changed": changed, "node_id": i.NodeID.String()}
	if err := s.Audit.Record(ctx, tx, audit.Entry{Action: ActionBootstrapSSH, TargetType: "app_instance", TargetID: i.ID.String(),
		TenantID: i.TenantID, ProjectID: i.ProjectID, Metadata: meta}); err != nil {
		return false, err
	}
	return true, nil
}
