package apps

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/gantry-gpu/gantry/nodeagent/internal/atomicfile"
	"github.com/gantry-gpu/gantry/nodeagent/tasks"
	"github.com/gantry-gpu/gantry/proto/fabric/apptask"
)

// EnvSSHAuthorizedKeys names, in every app process's environment, the file that holds
// the instance's bootstrap SSH trust (app.bootstrap_ssh): the public keys the app (its
// own sshd, an MPI launcher) should accept. The file is absent while nothing is trusted.
const EnvSSHAuthorizedKeys = "GANTRY_APP_SSH_AUTHORIZED_KEYS"

// trustFile is where an instance's trusted keys live, under its instance directory.
func trustFile(instanceDir string) string {
	return filepath.Join(instanceDir, ".ssh", "authorized_keys")
}

func (s *Supervisor) executeBootstrapSSH(_ context.Context, t tasks.Task) tasks.Result {
	if t.ContentType != "" && t.ContentType != apptask.ContentTypeJSON {
		return tasks.Fail(apptask.CodeInvalidPayload, fmt.Errorf("content type %q, want %s", t.ContentType, apptask.ContentTypeJSON))
	}
	var p apptask.BootstrapSSH
	dec := json.NewDecoder(strings.NewReader(string(t.Payload)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return tasks.Fail(apptask.CodeInvalidPayload, fmt.Errorf("app.bootstrap_ssh payload: %w", err))
	}
	if err := p.Validate(); err != nil {
		return tasks.Fail(apptask.CodeInvalidPayload, err)
	}
	code, err := s.BootstrapSSH(p)
	if err != nil {
		return tasks.Fail(code, err)
	}
	return tasks.Result{Status: tasks.Succeeded}
}

// BootstrapSSH makes the instance trust exactly p's keys (or none): it writes (or
// removes) <instance dir>/.ssh/authorized_keys, owned by the allocation's user.
// Idempotent. Revoking in an allocation that is no longer live succeeds (its home goes
// with it); trusting there fails with allocation_not_active.
func (s *Supervisor) BootstrapSSH(p apptask.BootstrapSSH) (string, error) {
	keys := make([]string, 0, len(p.PublicKeys))
	for i, k := range p.PublicKeys {
		if p.State == apptask.TrustRevoked {
			break
		}
		pk, comment, _, _, err := ssh.ParseAuthorizedKey([]byte(k))
		if err != nil {
			return apptask.CodeInvalidPayload, fmt.Errorf("public_keys[%d]: %w", i, err)
		}
		line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pk)))
		if comment != "" {
			line += " " + comment
		}
		keys = append(keys, line)
	}
	if _, allocationID, _, ok := s.target(p.AppInstanceID); ok && allocationID != p.AllocationID {
		return apptask.CodeAllocationMismatch, fmt.Errorf("app instance %s runs in allocation %s, not %s", p.AppInstanceID, allocationID, p.AllocationID)
	}
	env, live := s.o.Envs.Session(p.AllocationID)
	if !live {
		if p.State == apptask.TrustRevoked {
			return "", nil
		}
		return apptask.CodeAllocationNotActive, fmt.Errorf("allocation %s is not active on this node", p.AllocationID)
	}
	home := env.Dir
	if home == "" || !filepath.IsAbs(home) {
		return apptask.CodeStartFailed, fmt.Errorf("the allocation has no absolute home directory (%q)", home)
	}
	dir := instanceDir(home, p.AppInstanceID)
	file := trustFile(dir)
	if p.State == apptask.TrustRevoked {
		if err := os.Remove(file); err != nil && !errors.Is(err, os.ErrNotExist) {
			return apptask.CodeStartFailed, err
		}
		s.o.Logger.Info("app instance bootstrap ssh trust revoked", "app_instance_id", p.AppInstanceID)
		return "", nil
	}
	if err := makeInstanceDir(home, filepath.Dir(file), env); err != nil {
		return apptask.CodeStartFailed, fmt.Errorf("instance directory: %w", err)
	}
	_ = os.Chmod(filepath.Dir(file), 0o700)
	body := "# Written by gantry-nodeagent: the app instance's bootstrap SSH trust.\n" + strings.Join(keys, "\n") + "\n"
	if err := atomicfile.Write(file, []byte(body), 0o600); err != nil {
		return apptask.CodeStartFailed, err
	}
	if env.RealUser && os.Geteuid() == 0 {
		if err := os.Lchown(file, int(env.UID), int(env.GID)); err != nil {
			return apptask.CodeStartFailed, err
		}
	}
	s.o.Logger.Info("app instance bootstrap ssh trust written", "app_instance_id", p.AppInstanceID, "keys", len(keys))
	return "", nil
}
