// Package alloctask is the contract between the control plane and the node agent for
// allocation tasks: the task kinds, their JSON payloads and their results. Both sides
// import it so that the wire format has one definition.
//
// Every task names its allocation; the agent keys everything it does on the host by
// allocation id (runtime user, workspace), so a task that arrives again after the agent
// restarted finds the earlier work and completes it instead of doing it twice.
package alloctask

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Task kinds. The control plane sends provision when an allocation is requested, release
// when it enters releasing, stop when it enters stopped (budget suspend, runway
// exhausted) and restart when it enters restarting.
const (
	KindProvision = "allocation.provision"
	KindRelease   = "allocation.release"
	KindStop      = "allocation.stop"
	KindRestart   = "allocation.restart"
)

// Kinds lists every allocation task kind.
var Kinds = []string{KindProvision, KindRelease, KindStop, KindRestart}

// ContentType is how payloads and results are encoded.
const ContentType = "application/json"

// GPU is one GPU given to the allocation: its UUID as NVML reports it and its index.
type GPU struct {
	UUID  string `json:"uuid"`
	Index int    `json:"index"`
}

// Payload is the input of every allocation task kind. Release, stop and restart carry
// the same fields as provision so that an agent that lost its local state (host rebuilt)
// can still find and clean up what belongs to the allocation.
type Payload struct {
	AllocationID string `json:"allocation_id"`
	TenantID     string `json:"tenant_id"`
	ProjectID    string `json:"project_id"`
	// User is the runtime user name on the host (UserName(allocation id)).
	User          string   `json:"user"`
	GPUs          []GPU    `json:"gpus"`
	SSHPublicKeys []string `json:"ssh_public_keys"`
	// OSImage is the image's name when one was chosen (informational for runtimes that
	// do not reimage).
	OSImage string `json:"os_image,omitempty"`
}

// Limits on a payload, so an agent never acts on something unbounded.
const (
	MaxGPUs          = 16
	MaxSSHKeys       = 32
	MaxSSHKeyLength  = 16 << 10
	maxUserNameBytes = 32
)

var (
	uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	userRE = regexp.MustCompile(`^[a-z_][a-z0-9_-]*$`)
)

// UserName is the runtime user of an allocation: "g" and the first 12 hex digits of
// its id. Short enough for every useradd (32 bytes) and stable across redeliveries.
func UserName(allocationID string) string {
	return "g" + strings.ReplaceAll(allocationID, "-", "")[:12]
}

// Validate checks a payload before an agent acts on it.
func (p Payload) Validate() error {
	var errs []error
	if !uuidRE.MatchString(p.AllocationID) {
		errs = append(errs, fmt.Errorf("allocation_id %q is not a lowercase UUID", p.AllocationID))
	}
	if len(p.User) == 0 || len(p.User) > maxUserNameBytes || !userRE.MatchString(p.User) {
		errs = append(errs, fmt.Errorf("user %q is not a valid user name", p.User))
	}
	if len(p.GPUs) > MaxGPUs {
		errs = append(errs, fmt.Errorf("%d GPUs, at most %d", len(p.GPUs), MaxGPUs))
	}
	for _, g := range p.GPUs {
		if g.UUID == "" || len(g.UUID) > 128 || g.Index < 0 || g.Index > 1023 {
			errs = append(errs, fmt.Errorf("gpu %q index %d is not valid", g.UUID, g.Index))
		}
	}
	if len(p.SSHPublicKeys) > MaxSSHKeys {
		errs = append(errs, fmt.Errorf("%d SSH keys, at most %d", len(p.SSHPublicKeys), MaxSSHKeys))
	}
	for _, k := range p.SSHPublicKeys {
		if k == "" || len(k) > MaxSSHKeyLength || strings.ContainsAny(k, "\r\n") {
			errs = append(errs, errors.New("an SSH public key is empty, too long or spans lines"))
		}
	}
	return errors.Join(errs...)
}

// ProvisionResult is the result of a succeeded provision or restart: how the user reaches
// the workload.
type ProvisionResult struct {
	Host string `json:"host"`
	Port int    `json:"port"`
	User string `json:"user"`
}

// Error codes of failed allocation tasks (TaskResult.error_code).
const (
	CodeInvalidPayload = "invalid_payload"
	CodeGPUUnavailable = "gpu_unavailable"
	CodeRuntimeFailed  = "runtime_failed"
	CodeNotFound       = "allocation_not_found_on_node"
)
