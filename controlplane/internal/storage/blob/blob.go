package blob

import (
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Driver stores opaque byte strings under keys. Both drivers pass blobtest.Run.
type Driver interface {
	Name() string // "fs" | "s3"
	// Put streams r to key; size is the exact length or -1 (unknown). The object becomes
	// visible only when Put returns nil. It returns the bytes written and the sha256 hex
	// of the content. When r fails, ctx ends or the length differs from a known size
	// (ErrSizeMismatch), Put returns that error and nothing is left behind. Putting an
	// existing key replaces it whole.
	Put(ctx context.Context, key string, r io.Reader, size int64) (PutResult, error)
	// Open returns a reader for [off, off+n); n = -1 reads to the end and a range that
	// runs past the end is cut at the end (as HTTP and S3 do). off == size gives an
	// empty reader; off > size, off < 0 or n < -1 is ErrInvalidRange. ErrNotFound if
	// absent.
	Open(ctx context.Context, key string, off, n int64) (io.ReadCloser, error)
	// Stat returns the object's size, or ErrNotFound.
	Stat(ctx context.Context, key string) (Info, error)
	// Delete removes key; an absent key is not an error.
	Delete(ctx context.Context, key string) error
	// Check reports whether the backend answers and its root (directory, bucket)
	// exists: for startup and readiness.
	Check(ctx context.Context) error
	// Close releases the driver (the fs driver's open root directory).
	Close() error
}

// TempSweeper is implemented by both drivers: RemoveStaleTemps removes partial writes
// begun before cutoff (fs temp files, S3 unfinished multipart uploads) and returns how
// many. A failed Put cleans up after itself; these are what a crash of the control plane
// in the middle of a Put leaves. A sweeper calls it with a cutoff well before any upload
// that may still be in progress (its clock minus a day, say).
type TempSweeper interface {
	RemoveStaleTemps(ctx context.Context, cutoff time.Time) (int, error)
}

// Inventory is implemented by both drivers for tests and sweepers: every name the backend
// holds, complete objects and partial ones alike (fs temp files, S3 unfinished multipart
// uploads, the latter as "upload:<key>"), sorted. "Nothing left behind" is checked
// against it.
type Inventory interface {
	Inventory(ctx context.Context) ([]string, error)
}

// PutResult is what Put wrote.
type PutResult struct {
	Size   int64
	SHA256 string // lower-case hex of the content's sha256
}

// Info describes a stored object.
type Info struct {
	Size int64
}

var (
	// ErrNotFound: no object under the key.
	ErrNotFound = errors.New("blob: not found")
	// ErrSizeMismatch: the reader gave fewer or more bytes than the size declared.
	ErrSizeMismatch = errors.New("blob: content length differs from the declared size")
	// ErrInvalidRange: Open's range starts past the end or is negative.
	ErrInvalidRange = errors.New("blob: invalid range")
	// ErrInvalidKey: the key is not one Key produces (see ValidKey).
	ErrInvalidKey = errors.New("blob: invalid key")
)

// Key is the blob key of one version of one object:
// t/<tenant>/p/<project>/b/<bucket uuid>/<version uuid>. It never contains the user's
// object path or bucket_id, so no user input reaches the backend's namespace.
func Key(tenant, project, bucket, version uuid.UUID) string {
	return "t/" + tenant.String() + "/p/" + project.String() + "/b/" + bucket.String() + "/" + version.String()
}

// BucketPrefix is the key prefix (ending in "/") under which every version of a bucket's
// objects lives.
func BucketPrefix(tenant, project, bucket uuid.UUID) string {
	return "t/" + tenant.String() + "/p/" + project.String() + "/b/" + bucket.String() + "/"
}

// maxKeyLen keeps keys well inside both backends' limits (S3: 1024 bytes).
const maxKeyLen = 512

// ValidKey reports whether key is safe as a relative name on every backend: 1..512 bytes
// of "/"-separated elements of [A-Za-z0-9_-][A-Za-z0-9._-]*. No element starts with a
// dot, so "." and ".." cannot occur and the fs driver's ".put-" temp files can never be
// mistaken for (or collide with) an object. Keys from Key always pass; drivers refuse
// others with ErrInvalidKey as a second line of defence behind objpath.
func ValidKey(key string) bool {
	if key == "" || len(key) > maxKeyLen {
		return false
	}
	for _, e := range strings.Split(key, "/") {
		if e == "" || e[0] == '.' {
			return false
		}
		for i := 0; i < len(e); i++ {
			c := e[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
				return false
			}
		}
	}
	return true
}

func checkKey(key string) error {
	if !ValidKey(key) {
		return ErrInvalidKey
	}
	return nil
}

// span checks a range against an object of size bytes and returns its length.
func span(size, off, n int64) (int64, error) {
	if off < 0 || n < -1 || off > size {
		return 0, ErrInvalidRange
	}
	if n == -1 || n > size-off {
		n = size - off
	}
	return n, nil
}

// FileSection is implemented by the readers Open returns when their bytes are a
// section [off, off+n) of a local file (the fs driver): a server may send that section
// straight from the file to a socket (sendfile) rather than copying it through a buffer,
// which is most of the cost of a large download. f stays owned by the reader: the
// caller may move its offset but must not close it; closing the reader closes it.
type FileSection interface {
	FileSection() (f *os.File, off, n int64)
}
