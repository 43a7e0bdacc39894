package attach

import (
	"context"
	"io"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/objects"
)

// StorageBuckets is BucketAccess over the storage access rule (storage.Service.Authorize).
type StorageBuckets struct{ Svc *storage.Service }

var _ BucketAccess = StorageBuckets{}

// AuthorizeBucket implements BucketAccess.
func (s StorageBuckets) AuthorizeBucket(ctx context.Context, caller *principal.Principal, ownerProject uuid.UUID, bucketID string, write bool) (Bucket, error) {
	need := storage.Read
	if write {
		need = storage.ReadWrite
	}
	b, err := s.Svc.Authorize(ctx, caller, ownerProject, bucketID, need)
	if err != nil {
		return Bucket{}, err
	}
	return Bucket{ID: b.ID, TenantID: b.TenantID, ProjectID: b.ProjectID, BucketID: b.BucketID}, nil
}

// StoreObjects is Objects over the object store (objects.Store): the fabric's reads and
// writes take exactly the path of the API's, so quota, audit and visibility are the same.
type StoreObjects struct {
	Store *objects.Store
	// Cursors signs listing cursors handed to nodes (a node cannot forge a position).
	Cursors pagination.Codec
}

var _ Objects = StoreObjects{}

func bucketOf(b Bucket) objects.Bucket {
	return objects.Bucket{ID: b.ID, TenantID: b.TenantID, ProjectID: b.ProjectID, BucketID: b.BucketID}
}

func infoOf(o objects.ObjectInfo) ObjectInfo {
	return ObjectInfo{Path: o.Path, Size: o.SizeBytes, ETag: o.ETag, ContentType: o.ContentType, UpdatedAt: o.UpdatedAt}
}

// listSort binds a fabric listing cursor to its bucket, prefix and delimiter.
func listSort(b Bucket, prefix, delimiter string) string {
	return "attach:" + b.ID.String() + ":" + delimiter + ":" + prefix
}

// List implements Objects.
func (s StoreObjects) List(ctx context.Context, b Bucket, prefix, delimiter, cursor string, limit int) (ObjectPage, error) {
	sort := listSort(b, prefix, delimiter)
	var from *objects.Position
	if cursor != "" {
		from = &objects.Position{}
		if err := s.Cursors.Decode(cursor, sort, from); err != nil {
			return ObjectPage{}, err
		}
	}
	pg, err := s.Store.List(ctx, bucketOf(b), prefix, delimiter, from, limit)
	if err != nil {
		return ObjectPage{}, err
	}
	out := ObjectPage{}
	for _, e := range pg.Entries {
		if e.Prefix {
			out.Prefixes = append(out.Prefixes, e.Path)
		} else {
			out.Objects = append(out.Objects, infoOf(e.Object))
		}
	}
	if pg.Next != nil {
		next, err := s.Cursors.Encode(sort, pg.Next)
		if err != nil {
			return ObjectPage{}, err
		}
		out.Next = next
	}
	return out, nil
}

// Stat implements Objects.
func (s StoreObjects) Stat(ctx context.Context, b Bucket, path string) (ObjectInfo, error) {
	o, err := s.Store.Stat(ctx, bucketOf(b), path)
	return infoOf(o), err
}

// Open implements Objects.
func (s StoreObjects) Open(ctx context.Context, b Bucket, path string, off, n int64) (io.ReadCloser, ObjectInfo, error) {
	rc, o, err := s.Store.Open(ctx, bucketOf(b), path, off, n)
	return rc, infoOf(o), err
}

func actorOf(w Writer) objects.Actor {
	return objects.Actor{Type: audit.ActorNode, Metadata: map[string]any{
		"node_id": w.NodeID.String(), "attachment_id": w.AttachmentID.String(), "attached_by": w.UserID.String(),
	}}
}

// Put implements Objects.
func (s StoreObjects) Put(ctx context.Context, b Bucket, path string, r io.Reader, size int64, contentType string, w Writer) (ObjectInfo, error) {
	o, err := s.Store.Put(ctx, bucketOf(b), objects.PutInput{Path: path, Body: r, Size: size, ContentType: contentType, Actor: actorOf(w)})
	return infoOf(o), err
}

// Delete implements Objects.
func (s StoreObjects) Delete(ctx context.Context, b Bucket, path string, w Writer) error {
	return s.Store.Delete(ctx, bucketOf(b), path, "", actorOf(w))
}
