package alloctask

import (
	"errors"
	"fmt"
	"path"
	"regexp"
	"strings"
	"unicode/utf8"
)

// Storage task kinds: attach a bucket into an allocation, detach it again. They are
// allocation tasks in the wire sense (they name an allocation and reach its node) but
// leave the allocation's phase alone; the agent runs them in its storagemount package.
// A redelivered attach finds the existing mount (keyed by attachment id) and reports it
// again; a detach of an attachment the node does not hold succeeds.
const (
	KindStorageAttach = "storage.attach"
	KindStorageDetach = "storage.detach"
)

// StorageKinds lists the storage task kinds.
var StorageKinds = []string{KindStorageAttach, KindStorageDetach}

// Attachment modes.
const (
	StorageModeRO = "ro"
	StorageModeRW = "rw"
)

// Attachment methods: how the agent made the bucket appear.
const (
	// StorageMethodFUSE is a live FUSE mount: reads stream from the bucket, writes are
	// uploaded when a file is closed.
	StorageMethodFUSE = "fuse"
	// StorageMethodCopy is copy-in at attach and, for rw, copy-back at detach/release and
	// on a periodic sync (hosts without a usable /dev/fuse).
	StorageMethodCopy = "copy"
)

// Limits on a storage payload.
const (
	MaxBucketIDBytes  = 128
	MaxMountPathBytes = 1024
)

var bucketIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9:_./-]{0,127}$`)

// StoragePayload is the input of storage.attach and storage.detach. Detach carries the
// same fields, so an agent that lost its record of the attachment can still find the
// mount point and clean it up.
type StoragePayload struct {
	AllocationID string `json:"allocation_id"`
	// User is the allocation's runtime user on the host (UserName(allocation id)); the
	// mount lives in its home and its files belong to it.
	User         string `json:"user"`
	AttachmentID string `json:"attachment_id"`
	// BucketID is the bucket's user-chosen id (for the default mount path and logs; the
	// agent never names a bucket to the control plane, only the attachment).
	BucketID string `json:"bucket_id"`
	// Mode is StorageModeRO or StorageModeRW.
	Mode string `json:"mode"`
	// MountPath is relative to the user's home; "" means DefaultMountPath(BucketID).
	MountPath string `json:"mount_path,omitempty"`
}

// DefaultMountPath is where a bucket appears when the attachment names no path:
// ~/buckets/<bucket_id>.
func DefaultMountPath(bucketID string) string { return "buckets/" + bucketID }

// EffectiveMountPath is the mount path relative to the home: MountPath, or the default.
func (p StoragePayload) EffectiveMountPath() string {
	if p.MountPath == "" {
		return DefaultMountPath(p.BucketID)
	}
	return p.MountPath
}

// ValidMountPath reports whether rel is a usable mount path relative to a home
// directory: canonical (no leading or trailing slash, no empty, "." or ".." elements,
// no backslash), valid UTF-8 without control characters, at most MaxMountPathBytes.
func ValidMountPath(rel string) bool {
	if rel == "" || len(rel) > MaxMountPathBytes || !utf8.ValidString(rel) {
		return false
	}
	if strings.ContainsAny(rel, "\\") || path.Clean(rel) != rel || strings.HasPrefix(rel, "/") {
		return false
	}
	for _, r := range rel {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	for _, el := range strings.Split(rel, "/") {
		if el == "" || el == "." || el == ".." {
			return false
		}
	}
	return true
}

// Validate checks a storage payload before an agent acts on it.
func (p StoragePayload) Validate() error {
	var errs []error
	if !uuidRE.MatchString(p.AllocationID) {
		errs = append(errs, fmt.Errorf("allocation_id %q is not a lowercase UUID", p.AllocationID))
	}
	if !uuidRE.MatchString(p.AttachmentID) {
		errs = append(errs, fmt.Errorf("attachment_id %q is not a lowercase UUID", p.AttachmentID))
	}
	if len(p.User) == 0 || len(p.User) > maxUserNameBytes || !userRE.MatchString(p.User) {
		errs = append(errs, fmt.Errorf("user %q is not a valid user name", p.User))
	}
	if !bucketIDRE.MatchString(p.BucketID) {
		errs = append(errs, fmt.Errorf("bucket_id %q is not a valid bucket id", p.BucketID))
	}
	if p.Mode != StorageModeRO && p.Mode != StorageModeRW {
		errs = append(errs, fmt.Errorf("mode %q is neither %q nor %q", p.Mode, StorageModeRO, StorageModeRW))
	}
	// The default path is built from the bucket id, which may hold "." elements
	// ("a/../b" matches the bucket pattern), so it is checked like a given one.
	if mp := p.EffectiveMountPath(); !ValidMountPath(mp) {
		errs = append(errs, errors.New("mount_path must be a canonical path relative to the home directory (no \"..\", \".\", empty elements or leading slash)"))
	}
	return errors.Join(errs...)
}

// StorageResult is the result of a storage task. A succeeded attach sets Method and
// MountPath; a succeeded detach sets Method when the node held the attachment.
type StorageResult struct {
	// Method is StorageMethodFUSE or StorageMethodCopy.
	Method string `json:"method,omitempty"`
	// MountPath is the absolute path on the host (and inside the allocation), e.g.
	// /home/g0123456789ab/buckets/datasets.
	MountPath string `json:"mount_path,omitempty"`
	// ErrorCode and ErrorMessage repeat the failed TaskResult's code and message, for a
	// consumer that reads only the result body.
	ErrorCode    string `json:"error_code,omitempty"`
	ErrorMessage string `json:"error_message,omitempty"`
}

// Error codes of failed storage tasks (TaskResult.error_code). CodeInvalidPayload and
// CodeNotFound (the allocation is not on this node) apply too.
const (
	// CodeStorageMountFailed: neither a FUSE mount nor the copy-in worked (a message says
	// why, e.g. the mount point is a file).
	CodeStorageMountFailed = "storage_mount_failed"
	// CodeStorageUnavailable: the bucket could not be read over the fabric (tunnel down,
	// control plane refused); the task may be retried.
	CodeStorageUnavailable = "storage_unavailable"
	// CodeStorageSyncFailed: a detach of a rw copy-mode attachment could not upload every
	// change (quota, refused); the files stay on the host and the attachment stays held.
	CodeStorageSyncFailed = "storage_sync_failed"
)
