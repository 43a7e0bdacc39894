package objects

import (
	"time"

	"github.com/google/uuid"
)

// ObjectInfo is what the control plane knows about one stored object.
type ObjectInfo struct {
	Path        string
	SizeBytes   int64
	ETag        string // quoted sha256 hex of the content
	ContentType string
	CreatedBy   uuid.NullUUID
	CreatedAt   time.Time
	UpdatedAt   time.Time // Last-Modified: when this content was committed
	// blobKey is where the bytes of this version live in the driver.
	blobKey string
}

// DefaultContentType is the type of an object stored without one.
const DefaultContentType = "application/octet-stream"
