// Package apptask is the contract between the control plane and the node agent for app
// instances: the task kinds app.start and app.stop with their protobuf payloads
// (fabricv1.AppStartTask, fabricv1.AppStopTask), the controller report the agent sends
// for every instance (fabricv1.ControllerReport with controller "app_instance" and an
// AppInstanceStatus), its states and reasons, and the limits both sides check. Both
// sides import it so the wire format has one definition (like shared/alloctask for
// allocations).
package apptask

import (
	"errors"
	"fmt"
	"path"
	"regexp"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
)

// Task kinds.
const (
	KindStart = "app.start"
	KindStop  = "app.stop"
)

// Kinds lists every app task kind.
var Kinds = []string{KindStart, KindStop}

// ContentType is how app task payloads and results are encoded.
const ContentType = "application/protobuf"

// Controller is ControllerReport.controller for app instance reports.
const Controller = "app_instance"

// Report states (ControllerReport.state for controller "app_instance").
const (
	StateStarting  = "starting"
	StateRunning   = "running"
	StateUnhealthy = "unhealthy"
	StateStopped   = "stopped"
	StateFailed    = "failed"
)

// States lists every state an agent reports.
var States = []string{StateStarting, StateRunning, StateUnhealthy, StateStopped, StateFailed}

// Terminal reports whether state is final on the agent: the instance's process is gone
// and will not be restarted.
func Terminal(state string) bool { return state == StateStopped || state == StateFailed }

// Live reports whether the instance's process is supervised (app proxy streams connect).
func Live(state string) bool {
	return state == StateStarting || state == StateRunning || state == StateUnhealthy
}

// Reasons (AppInstanceStatus.reason) for "failed" and "stopped".
const (
	ReasonNeverHealthy       = "never_healthy"
	ReasonCrashLoop          = "crash_loop"
	ReasonStartFailed        = "start_failed"
	ReasonStopped            = "stopped"
	ReasonAllocationInactive = "allocation_inactive"
	ReasonUnknownInstance    = "unknown_instance"
	// ReasonArtifactDigestMismatch: an artifact file's bytes did not match the SHA-256
	// pinned at launch (or the control plane's stored digest); the app never started.
	ReasonArtifactDigestMismatch = "artifact_digest_mismatch"
	// ReasonArtifactUnavailable: an artifact file could not be fetched.
	ReasonArtifactUnavailable = "artifact_unavailable"
)

// Task error codes (TaskResult.error_code of a failed app task).
const (
	CodeInvalidPayload      = "invalid_payload"
	CodeAllocationNotActive = "allocation_not_active"
	CodeInsufficientGPUs    = "insufficient_gpus"
	CodeInstanceTerminal    = "app_instance_terminal"
	CodeAllocationMismatch  = "app_instance_allocation_mismatch"
	CodeStartFailed         = "start_failed"
	CodeStopFailed          = "stop_failed"
	// CodeArtifactDigestMismatch / CodeArtifactUnavailable fail an app.start whose
	// artifacts could not be placed (the reasons of the same names).
	CodeArtifactDigestMismatch = ReasonArtifactDigestMismatch
	CodeArtifactUnavailable    = ReasonArtifactUnavailable
)

// Stream refusal codes (StreamReply.error_code of an APP_PROXY stream).
const (
	StreamTargetNotFound = "target_not_found"
	StreamAppNotRunning  = "app_not_running"
	StreamConnectFailed  = "connect_failed"
)

// Limits on a payload, so an agent never acts on something unbounded.
const (
	MaxCommandArgs    = 256
	MaxArgBytes       = 4096
	MaxEnv            = 128
	MaxEnvKeyBytes    = 128
	MaxEnvValueBytes  = 4096
	MaxBasePathBytes  = 256
	MaxHTTPPathBytes  = 1024
	MaxSlugBytes      = 64
	MaxVersionBytes   = 64
	MaxRestarts       = 1000
	MaxStartupTimeout = 24 * time.Hour
	MaxBackoff        = time.Hour
	MaxGrace          = 10 * time.Minute
	MaxMessageBytes   = 1024
	// The catalog allows health checks every 1..300 s with a 1..60 s timeout.
	MaxHealthInterval = 5 * time.Minute
	MaxHealthTimeout  = time.Minute
	// Artifacts of one start: at most MaxArtifacts, MaxArtifactFiles files in all.
	MaxArtifacts     = 16
	MaxArtifactFiles = 1000
	MaxArtifactPath  = 1024
)

// ArtifactsDir is {artifacts_dir} under an instance's directory: artifact <name> is at
// ArtifactsDir/<name>.
const ArtifactsDir = "artifacts"

// Defaults for unset payload fields.
const (
	DefaultStartupTimeout   = 120 * time.Second
	DefaultMaxRestarts      = 5
	DefaultBackoffMin       = time.Second
	DefaultBackoffMax       = 60 * time.Second
	DefaultHealthInterval   = 2 * time.Second
	DefaultHealthTimeout    = time.Second
	DefaultFailureThreshold = 3
	DefaultStopGrace        = 10 * time.Second
)

// Health check types.
const (
	HealthHTTP = "http"
	HealthTCP  = "tcp"
)

var (
	artifactNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,119}$`)
	uuidRE         = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	envKeyRE       = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// IsUUID reports whether s is a lowercase UUID (the ids in app payloads).
func IsUUID(s string) bool { return uuidRE.MatchString(s) }

// ValidateStart checks an app.start payload before an agent acts on it.
func ValidateStart(t *fabricv1.AppStartTask) error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if !IsUUID(t.GetAppInstanceId()) {
		add("app_instance_id %q is not a lowercase UUID", t.GetAppInstanceId())
	}
	if !IsUUID(t.GetAllocationId()) {
		add("allocation_id %q is not a lowercase UUID", t.GetAllocationId())
	}
	if len(t.GetAppSlug()) > MaxSlugBytes || len(t.GetVersion()) > MaxVersionBytes {
		add("app_slug or version too long")
	}
	switch n := len(t.GetCommand()); {
	case n == 0:
		add("command is empty")
	case n > MaxCommandArgs:
		add("command has %d arguments (at most %d)", n, MaxCommandArgs)
	case t.GetCommand()[0] == "":
		add("command[0] is empty")
	}
	for i, a := range t.GetCommand() {
		if len(a) > MaxArgBytes || strings.IndexByte(a, 0) >= 0 {
			add("command[%d] is longer than %d bytes or has a NUL byte", i, MaxArgBytes)
		}
	}
	if len(t.GetEnv()) > MaxEnv {
		add("env has %d entries (at most %d)", len(t.GetEnv()), MaxEnv)
	}
	for k, v := range t.GetEnv() {
		if len(k) > MaxEnvKeyBytes || !envKeyRE.MatchString(k) {
			add("env key %q is not a variable name", k)
		}
		if len(v) > MaxEnvValueBytes || strings.IndexByte(v, 0) >= 0 {
			add("env %s: value longer than %d bytes or has a NUL byte", k, MaxEnvValueBytes)
		}
	}
	if t.GetPort() > 65535 {
		add("port %d out of range", t.GetPort())
	}
	if bp := t.GetBasePath(); bp != "" && (len(bp) > MaxBasePathBytes || !strings.HasPrefix(bp, "/") || strings.ContainsAny(bp, " \t\r\n\x00")) {
		add("base_path %q must be an absolute URL path of at most %d bytes", bp, MaxBasePathBytes)
	}
	if hc := t.GetHealthCheck(); hc != nil {
		switch hc.GetType() {
		case HealthHTTP:
			if p := hc.GetHttpPath(); !strings.HasPrefix(p, "/") || len(p) > MaxHTTPPathBytes || strings.ContainsAny(p, " \t\r\n\x00") {
				add("health_check.http_path %q must be an absolute URL path", p)
			}
		case HealthTCP, "":
		default:
			add("health_check.type %q is not http or tcp", hc.GetType())
		}
		durationIn(&errs, "health_check.interval", hc.GetInterval().AsDuration(), MaxHealthInterval)
		durationIn(&errs, "health_check.timeout", hc.GetTimeout().AsDuration(), MaxHealthTimeout)
		if hc.GetFailureThreshold() > 100 {
			add("health_check.failure_threshold %d above 100", hc.GetFailureThreshold())
		}
	}
	durationIn(&errs, "startup_timeout", t.GetStartupTimeout().AsDuration(), MaxStartupTimeout)
	durationIn(&errs, "backoff_min", t.GetBackoffMin().AsDuration(), MaxBackoff)
	durationIn(&errs, "backoff_max", t.GetBackoffMax().AsDuration(), MaxBackoff)
	if t.GetMaxRestarts() > MaxRestarts {
		add("max_restarts %d above %d", t.GetMaxRestarts(), MaxRestarts)
	}
	if t.GetMinGpus() > 64 {
		add("min_gpus %d above 64", t.GetMinGpus())
	}
	validateArtifacts(t.GetArtifacts(), add)
	return errors.Join(errs...)
}

// ValidateStop checks an app.stop payload.
func ValidateStop(t *fabricv1.AppStopTask) error {
	var errs []error
	if !IsUUID(t.GetAppInstanceId()) {
		errs = append(errs, fmt.Errorf("app_instance_id %q is not a lowercase UUID", t.GetAppInstanceId()))
	}
	if id := t.GetAllocationId(); id != "" && !IsUUID(id) {
		errs = append(errs, fmt.Errorf("allocation_id %q is not a lowercase UUID", id))
	}
	durationIn(&errs, "grace", t.GetGrace().AsDuration(), MaxGrace)
	return errors.Join(errs...)
}

func durationIn(errs *[]error, name string, d, limit time.Duration) {
	if d < 0 || d > limit {
		*errs = append(*errs, fmt.Errorf("%s %s outside 0..%s", name, d, limit))
	}
}

// Encode marshals a payload or result (deterministically, so redeliveries are equal).
func Encode(m proto.Message) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(m)
}

// DecodeStart parses and validates an app.start payload.
func DecodeStart(b []byte) (*fabricv1.AppStartTask, error) {
	t := &fabricv1.AppStartTask{}
	if err := proto.Unmarshal(b, t); err != nil {
		return nil, fmt.Errorf("app.start payload: %w", err)
	}
	if err := ValidateStart(t); err != nil {
		return nil, err
	}
	return t, nil
}

// DecodeStop parses and validates an app.stop payload.
func DecodeStop(b []byte) (*fabricv1.AppStopTask, error) {
	t := &fabricv1.AppStopTask{}
	if err := proto.Unmarshal(b, t); err != nil {
		return nil, fmt.Errorf("app.stop payload: %w", err)
	}
	if err := ValidateStop(t); err != nil {
		return nil, err
	}
	return t, nil
}

// DecodeStartResult parses an app.start result.
func DecodeStartResult(b []byte) (*fabricv1.AppStartResult, error) {
	r := &fabricv1.AppStartResult{}
	if err := proto.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("app.start result: %w", err)
	}
	return r, nil
}

// KindBootstrapSSH is the task that reconciles an app instance's bootstrap SSH trust
// (seed §6.2 rule 2): the node makes the instance trust exactly the payload's public
// keys (state "trusted") or none ("revoked"). Its payload is JSON (BootstrapSSH).
const KindBootstrapSSH = "app.bootstrap_ssh"

// ContentTypeJSON is the content type of app.bootstrap_ssh payloads.
const ContentTypeJSON = "application/json"

// Bootstrap SSH trust states.
const (
	TrustTrusted = "trusted"
	TrustRevoked = "revoked"
)

// Limits of a bootstrap SSH payload.
const (
	MaxTrustedKeys     = 32
	MaxTrustedKeyBytes = 16 << 10
)

// BootstrapSSH is the JSON payload of app.bootstrap_ssh.
type BootstrapSSH struct {
	AppInstanceID string   `json:"app_instance_id"`
	AllocationID  string   `json:"allocation_id"`
	State         string   `json:"state"`
	PublicKeys    []string `json:"public_keys"`
}

// Validate checks the payload's shape (each key's format is the agent's to parse).
func (b BootstrapSSH) Validate() error {
	var errs []error
	if !IsUUID(b.AppInstanceID) || !IsUUID(b.AllocationID) {
		errs = append(errs, errors.New("app_instance_id and allocation_id must be lowercase UUIDs"))
	}
	switch b.State {
	case TrustTrusted, TrustRevoked: // keys sent with "revoked" are ignored
	default:
		errs = append(errs, fmt.Errorf("state %q is not trusted or revoked", b.State))
	}
	if len(b.PublicKeys) > MaxTrustedKeys {
		errs = append(errs, fmt.Errorf("%d public keys (at most %d)", len(b.PublicKeys), MaxTrustedKeys))
	}
	for i, k := range b.PublicKeys {
		if len(k) > MaxTrustedKeyBytes || strings.ContainsAny(k, "\r\n\x00") {
			errs = append(errs, fmt.Errorf("public_keys[%d] is longer than %d bytes or spans lines", i, MaxTrustedKeyBytes))
		}
	}
	return errors.Join(errs...)
}

// validateArtifacts checks the artifacts of a start: bounded, distinct names that are
// safe directory names, canonical relative paths (nothing can land outside its
// artifact's directory), sizes and digests well formed.
func validateArtifacts(arts []*fabricv1.AppArtifactMount, add func(string, ...any)) {
	if len(arts) > MaxArtifacts {
		add("%d artifacts (at most %d)", len(arts), MaxArtifacts)
		return
	}
	names := map[string]bool{}
	files := 0
	for i, a := range arts {
		if !IsUUID(a.GetArtifactId()) {
			add("artifacts[%d].artifact_id %q is not a lowercase UUID", i, a.GetArtifactId())
		}
		if !artifactNameRE.MatchString(a.GetName()) {
			add("artifacts[%d].name %q is not an artifact name", i, a.GetName())
		} else if names[a.GetName()] {
			add("artifacts[%d].name %q appears twice", i, a.GetName())
		}
		names[a.GetName()] = true
		files += len(a.GetFiles())
		if files > MaxArtifactFiles {
			add("more than %d artifact files", MaxArtifactFiles)
			return
		}
		paths := map[string]bool{}
		for j, f := range a.GetFiles() {
			if !CleanArtifactPath(f.GetPath()) || paths[f.GetPath()] {
				add("artifacts[%d].files[%d].path %q is not a canonical relative path, or repeats", i, j, f.GetPath())
			}
			paths[f.GetPath()] = true
			if f.GetSizeBytes() < 0 || len(f.GetSha256()) != 64 || strings.Trim(f.GetSha256(), "0123456789abcdef") != "" {
				add("artifacts[%d].files[%d]: size or sha256 malformed", i, j)
			}
		}
	}
	// A file path that is a directory of another would fail on the node; the
	// control plane's object path rules forbid neither, so it is refused here.
	for i, a := range arts {
		paths := map[string]bool{}
		for _, f := range a.GetFiles() {
			paths[f.GetPath()] = true
		}
		for _, f := range a.GetFiles() {
			if !CleanArtifactPath(f.GetPath()) {
				continue // refused above; path.Dir of an absolute path never reaches "."
			}
			for d := path.Dir(f.GetPath()); d != "." && d != "/"; d = path.Dir(d) {
				if paths[d] {
					add("artifacts[%d]: %q is both a file and a directory", i, d)
				}
			}
		}
	}
}

// CleanArtifactPath reports whether p is a canonical relative path: not empty, no
// leading slash, no "." or ".." elements, no empty elements, no NUL, at most
// MaxArtifactPath bytes.
func CleanArtifactPath(p string) bool {
	if p == "" || len(p) > MaxArtifactPath || strings.IndexByte(p, 0) >= 0 || strings.HasPrefix(p, "/") {
		return false
	}
	for _, e := range strings.Split(p, "/") {
		if e == "" || e == "." || e == ".." {
			return false
		}
	}
	return true
}
