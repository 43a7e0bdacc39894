package artifacts

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"sort"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/controlplane/internal/storage/blob"
	"github.com/gantry-gpu/gantry/proto/fabric/apptask"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/ids"
)

// MaxFiles bounds an artifact's files (AppArtifact.files is at most 1000 long).
const MaxFiles = 1000

// DefaultMaxFileBytes bounds one file when Config leaves it 0 (the object store's
// per-PUT default, 5 GiB).
const DefaultMaxFileBytes = 5 << 30

// Artifact is a named, versioned file set of a project.
type Artifact struct {
	ID          uuid.UUID
	TenantID    uuid.UUID
	ProjectID   uuid.UUID
	Name        string
	Version     string
	Kind        string
	Description string
	Files       []File // by path
	CreatedBy   uuid.UUID
	CreatedAt   time.Time
	UpdatedAt   time.Time
}

// File is one file of an artifact.
type File struct {
	Path      string
	SizeBytes int64
	SHA256    string // hex
	blobKey   string
	CreatedAt time.Time
}

// Digest is the file's digest as the contract spells it.
func (f File) Digest() string { return "sha256:" + f.SHA256 }

// Size is the sum of the files' sizes.
func (a Artifact) Size() int64 {
	var n int64
	for _, f := range a.Files {
		n += f.SizeBytes
	}
	return n
}

// ContentDigest is sha256 over the sorted "<path> <file digest>\n" lines ("" with no
// file): it changes with any byte of any file, and not with upload order.
func (a Artifact) ContentDigest() string {
	if len(a.Files) == 0 {
		return ""
	}
	files := append([]File(nil), a.Files...)
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	h := sha256.New()
	for _, f := range files {
		fmt.Fprintf(h, "%s %s\n", f.Path, f.Digest())
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// StorageLocation says where the bytes are: the blob driver and the key prefix.
func (s *Service) StorageLocation(a Artifact) string {
	return s.Blob.Name() + ":" + keyPrefix(a.ID)
}

func keyPrefix(id uuid.UUID) string { return "app-artifacts/" + id.String() + "/" }

// Service is artifacts over PostgreSQL and a blob driver.
type Service struct {
	Pool  *pgxpool.Pool
	Blob  blob.Driver
	Clock clock.Clock
	IDs   ids.Source
	Audit *audit.Log
	Log   *slog.Logger
	// MaxFileBytes bounds one file (GANTRY_STORAGE_MAX_OBJECT_BYTES).
	MaxFileBytes int64
	// DigestMismatches counts reads refused because the stored bytes no longer match.
	DigestMismatches prometheus.Counter
}

// New returns the service; reg (optional) gets its counter.
func New(pool *pgxpool.Pool, drv blob.Driver, clk clock.Clock, idSrc ids.Source, maxFileBytes int64, log *slog.Logger, reg prometheus.Registerer) (*Service, error) {
	if maxFileBytes <= 0 {
		maxFileBytes = DefaultMaxFileBytes
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Service{Pool: pool, Blob: drv, Clock: clk, IDs: idSrc, Audit: &audit.Log{Clock: clk, IDs: idSrc}, Log: log, MaxFileBytes: maxFileBytes,
		DigestMismatches: prometheus.NewCounter(prometheus.CounterOpts{Name: "app_artifact_digest_mismatch_total",
			Help: "Reads of app artifact files refused because the stored bytes no longer match their SHA-256."})}
	if reg != nil {
		if err := reg.Register(s.DigestMismatches); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func notFound() *apierr.Error { return apierr.NotFound(apierr.StorageObjectNotFound, "artifact") }

// NewArtifact is what a caller creates.
type NewArtifact struct {
	Name, Version, Kind, Description string
}

// Create adds an empty artifact to the project, audited app_artifact.create.
func (s *Service) Create(ctx context.Context, proj projectctx.Project, actor uuid.UUID, in NewArtifact) (Artifact, error) {
	now := s.Clock.Now()
	a := Artifact{ID: s.IDs.New(), TenantID: proj.TenantID, ProjectID: proj.ID, Name: in.Name, Version: in.Version, Kind: in.Kind,
		Description: in.Description, Files: []File{}, CreatedBy: actor, CreatedAt: now, UpdatedAt: now}
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO app_artifacts (id, tenant_id, project_id, name, version, kind, description, created_by, created_at, updated_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9)`, a.ID, a.TenantID, a.ProjectID, a.Name, a.Version, a.Kind, a.Description, actor, now)
		if db.IsUniqueViolation(err, "app_artifacts_project_name_version_key") {
			return apierr.New(apierr.StorageAlreadyExists, "artifact %s version %s exists in this project", in.Name, in.Version)
		}
		if err != nil {
			return fmt.Errorf("insert artifact: %w", err)
		}
		return s.Audit.Record(ctx, tx, audit.Entry{Action: "app_artifact.create", TargetType: "app_artifact", TargetID: a.ID.String(),
			TenantID: a.TenantID, ProjectID: a.ProjectID, Metadata: map[string]any{"name": a.Name, "version": a.Version, "kind": a.Kind}})
	})
	if err != nil {
		return Artifact{}, err
	}
	return a, nil
}

const artifactColumns = `id, tenant_id, project_id, name, version, kind, description, created_by, created_at, updated_at`

func scanArtifact(row pgx.Row) (Artifact, error) {
	var a Artifact
	err := row.Scan(&a.ID, &a.TenantID, &a.ProjectID, &a.Name, &a.Version, &a.Kind, &a.Description, &a.CreatedBy, &a.CreatedAt, &a.UpdatedAt)
	return a, err
}

// Get loads an artifact of the project with its files; another project's is not found.
func (s *Service) Get(ctx context.Context, projectID, id uuid.UUID) (Artifact, error) {
	q := db.Querier(ctx, s.Pool)
	a, err := scanArtifact(q.QueryRow(ctx, `SELECT `+artifactColumns+` FROM app_artifacts WHERE id = $1 AND project_id = $2`, id, projectID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Artifact{}, notFound()
	}
	if err != nil {
		return Artifact{}, fmt.Errorf("get artifact: %w", err)
	}
	list := []Artifact{a}
	if err := s.fillFiles(ctx, list); err != nil {
		return Artifact{}, err
	}
	return list[0], nil
}

// Position is a listing cursor: artifacts are listed by name, then version, then id.
type Position struct {
	Name    string    `json:"n"`
	Version string    `json:"v"`
	ID      uuid.UUID `json:"i"`
}

// List is a page of the project's artifacts after pos (nil: from the start).
func (s *Service) List(ctx context.Context, projectID uuid.UUID, pos *Position, limit int) ([]Artifact, bool, error) {
	after := Position{}
	if pos != nil {
		after = *pos
	}
	rows, err := db.Querier(ctx, s.Pool).Query(ctx, `SELECT `+artifactColumns+` FROM app_artifacts
		WHERE project_id = $1 AND (name, version, id) > ($2, $3, $4) ORDER BY name, version, id LIMIT $5`,
		projectID, after.Name, after.Version, after.ID, limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("list artifacts: %w", err)
	}
	var out []Artifact
	for rows.Next() {
		a, err := scanArtifact(rows)
		if err != nil {
			rows.Close()
			return nil, false, err
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, false, err
	}
	more := len(out) > limit
	if more {
		out = out[:limit]
	}
	return out, more, s.fillFiles(ctx, out)
}

func (s *Service) fillFiles(ctx context.Context, list []Artifact) error {
	if len(list) == 0 {
		return nil
	}
	at := map[uuid.UUID]int{}
	ids := make([]uuid.UUID, len(list))
	for i := range list {
		ids[i], at[list[i].ID] = list[i].ID, i
		list[i].Files = []File{}
	}
	rows, err := db.Querier(ctx, s.Pool).Query(ctx, `SELECT artifact_id, path, size_bytes, sha256, blob_key, created_at
		FROM app_artifact_files WHERE artifact_id = ANY($1) ORDER BY artifact_id, path`, ids)
	if err != nil {
		return fmt.Errorf("artifact files: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id uuid.UUID
		var f File
		if err := rows.Scan(&id, &f.Path, &f.SizeBytes, &f.SHA256, &f.blobKey, &f.CreatedAt); err != nil {
			return err
		}
		list[at[id]].Files = append(list[at[id]].Files, f)
	}
	return rows.Err()
}

// PutFile streams body into the artifact's file at path (already cleaned). The bytes
// go to the blob store first (hashed as they arrive); the file row commits after them,
// so a file is listed only once its bytes are whole. A path already there is
// storage_already_exists; a body over MaxFileBytes is 413 storage_quota_exceeded.
func (s *Service) PutFile(ctx context.Context, projectID, id uuid.UUID, path string, body io.Reader) (File, error) {
	a, err := s.Get(ctx, projectID, id)
	if err != nil {
		return File{}, err
	}
	for _, f := range a.Files {
		if f.Path == path {
			return File{}, apierr.New(apierr.StorageAlreadyExists, "the artifact already has a file at this path").With("field", "path")
		}
	}
	if len(a.Files) >= MaxFiles {
		return File{}, apierr.Validation("path", "an artifact has at most %d files", MaxFiles).With("reason", "too_many_files")
	}
	key := keyPrefix(id) + s.IDs.New().String()
	lim := &capped{r: body, left: s.MaxFileBytes}
	res, err := s.Blob.Put(ctx, key, lim, -1)
	if lim.over {
		return File{}, apierr.New(apierr.StorageQuotaExceeded, "a file is at most %d bytes", s.MaxFileBytes).
			With("reason", "object_too_large").WithStatus(413)
	}
	if err != nil {
		return File{}, apierr.New(apierr.InvalidRequest, "the upload did not complete").With("reason", "upload_incomplete").Wrap(err)
	}
	f := File{Path: path, SizeBytes: res.Size, SHA256: res.SHA256, blobKey: key, CreatedAt: s.Clock.Now()}
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		var n int
		// The artifact's row serialises concurrent uploads (the file limit holds).
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM app_artifact_files WHERE artifact_id = (SELECT id FROM app_artifacts WHERE id = $1 FOR UPDATE)`, id).Scan(&n); err != nil {
			return err
		}
		if n >= MaxFiles {
			return apierr.Validation("path", "an artifact has at most %d files", MaxFiles).With("reason", "too_many_files")
		}
		_, err := tx.Exec(ctx, `INSERT INTO app_artifact_files (artifact_id, path, size_bytes, sha256, blob_key, created_at) VALUES ($1, $2, $3, $4, $5, $6)`,
			id, path, f.SizeBytes, f.SHA256, key, f.CreatedAt)
		if db.IsUniqueViolation(err, "app_artifact_files_pkey") {
			return apierr.New(apierr.StorageAlreadyExists, "the artifact already has a file at this path").With("field", "path")
		}
		if err != nil {
			return fmt.Errorf("insert artifact file: %w", err)
		}
		if _, err := tx.Exec(ctx, `UPDATE app_artifacts SET updated_at = $2 WHERE id = $1`, id, f.CreatedAt); err != nil {
			return err
		}
		return s.Audit.Record(ctx, tx, audit.Entry{Action: "app_artifact.file.put", TargetType: "app_artifact", TargetID: id.String(),
			TenantID: a.TenantID, ProjectID: a.ProjectID, Metadata: map[string]any{"path": path, "size_bytes": f.SizeBytes, "digest": f.Digest()}})
	})
	if err != nil {
		// Nothing references the bytes: remove them now (best effort; the key is unique
		// to this upload, so nothing else can be hurt).
		if derr := s.Blob.Delete(context.WithoutCancel(ctx), key); derr != nil {
			s.Log.WarnContext(ctx, "artifact blob left behind", "key", key, "err", derr)
		}
		return File{}, err
	}
	return f, nil
}

// capped stops a body at left bytes and says so (over), rather than storing a part.
type capped struct {
	r    io.Reader
	left int64
	over bool
}

var errTooLarge = errors.New("artifact file too large")

func (c *capped) Read(p []byte) (int, error) {
	if int64(len(p)) > c.left+1 {
		p = p[:c.left+1]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	if c.left < 0 {
		c.over = true
		return 0, errTooLarge
	}
	return n, err
}

// ErrDigestMismatch: the stored bytes of a file no longer match its SHA-256.
var ErrDigestMismatch = errors.New("artifact file bytes do not match their digest")

// OpenFile opens a file of the artifact for reading. The reader checks the bytes
// against the file's SHA-256 as they pass and holds the last chunk back until the
// check is done: a mismatch is ErrDigestMismatch before the final byte is returned, so
// a reader never receives the whole of a file whose bytes changed.
func (s *Service) OpenFile(ctx context.Context, projectID, id uuid.UUID, path string) (File, io.ReadCloser, error) {
	var f File
	err := db.Querier(ctx, s.Pool).QueryRow(ctx, `SELECT f.path, f.size_bytes, f.sha256, f.blob_key, f.created_at
		FROM app_artifact_files f JOIN app_artifacts a ON a.id = f.artifact_id
		WHERE a.id = $1 AND a.project_id = $2 AND f.path = $3`, id, projectID, path).Scan(&f.Path, &f.SizeBytes, &f.SHA256, &f.blobKey, &f.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return File{}, nil, apierr.NotFound(apierr.StorageObjectNotFound, "artifact file")
	}
	if err != nil {
		return File{}, nil, fmt.Errorf("artifact file: %w", err)
	}
	rc, err := s.Blob.Open(ctx, f.blobKey, 0, -1)
	if errors.Is(err, blob.ErrNotFound) {
		s.mismatch(ctx, id, f, "bytes missing")
		return File{}, nil, apierr.New(apierr.InternalError, "the artifact file's bytes are missing").Wrap(err)
	}
	if err != nil {
		return File{}, nil, apierr.New(apierr.ServiceUnavailable, "the artifact store is unavailable").Wrap(err)
	}
	v := &verifier{r: rc, h: sha256.New(), size: f.SizeBytes, want: f.SHA256,
		onMismatch: func() { s.mismatch(ctx, id, f, "digest mismatch") }}
	return f, v, nil
}

func (s *Service) mismatch(ctx context.Context, id uuid.UUID, f File, what string) {
	s.DigestMismatches.Inc()
	s.Log.ErrorContext(ctx, "app artifact file refused: "+what, "artifact_id", id, "path", f.Path, "digest", f.Digest())
}

// verifier hashes what passes and withholds the last chunk until the digest is known.
type verifier struct {
	r          io.ReadCloser
	h          hash.Hash
	size, read int64
	want       string
	checked    bool
	onMismatch func()
	err        error
}

func (v *verifier) Read(p []byte) (int, error) {
	if v.err != nil {
		return 0, v.err
	}
	if v.read == v.size {
		if !v.checked && !v.check() { // an empty file: nothing was read yet
			return 0, v.err
		}
		return 0, io.EOF
	}
	if left := v.size - v.read; int64(len(p)) > left {
		p = p[:left]
	}
	n, err := io.ReadFull(v.r, p)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		v.err = err
		return 0, err
	}
	_, _ = v.h.Write(p[:n])
	v.read += int64(n)
	if n < len(p) { // the stored bytes are shorter than the file
		v.fail()
		return 0, v.err
	}
	// The last chunk is released only if the whole file matches.
	if v.read == v.size && !v.check() {
		return 0, v.err
	}
	return n, nil
}

// check compares the digest once everything was read, and refuses stored bytes longer
// than the file.
func (v *verifier) check() bool {
	v.checked = true
	var extra [1]byte
	if m, _ := v.r.Read(extra[:]); m > 0 || hex.EncodeToString(v.h.Sum(nil)) != v.want {
		v.fail()
		return false
	}
	return true
}

func (v *verifier) fail() {
	v.err = ErrDigestMismatch
	if v.onMismatch != nil {
		v.onMismatch()
	}
}

func (v *verifier) Close() error { return v.r.Close() }

// CheckProjectArtifacts is nil when every id is an artifact of the project and the set
// can be placed on a node together (the instances launch check); otherwise 422
// validation_error naming the first offender: reason artifact_not_found (not the
// project's, or not there), duplicate_artifact_name (two artifacts of one name: each is
// placed in a directory of its name), too_many_files (more than
// apptask.MaxArtifactFiles files in all).
func (s *Service) CheckProjectArtifacts(ctx context.Context, projectID uuid.UUID, ids []uuid.UUID) error {
	if len(ids) == 0 {
		return nil
	}
	rows, err := db.Querier(ctx, s.Pool).Query(ctx, `SELECT a.id, a.name,
		(SELECT count(*) FROM app_artifact_files f WHERE f.artifact_id = a.id)
		FROM app_artifacts a WHERE a.project_id = $1 AND a.id = ANY($2)`, projectID, ids)
	if err != nil {
		return fmt.Errorf("check artifacts: %w", err)
	}
	defer rows.Close()
	type found struct {
		name  string
		files int64
	}
	byID := map[uuid.UUID]found{}
	for rows.Next() {
		var id uuid.UUID
		var f found
		if err := rows.Scan(&id, &f.name, &f.files); err != nil {
			return err
		}
		byID[id] = f
	}
	if err := rows.Err(); err != nil {
		return err
	}
	names := map[string]uuid.UUID{}
	var files int64
	for _, id := range ids {
		f, ok := byID[id]
		if !ok {
			return apierr.Validation("artifact_ids", "artifact %s is not an artifact of this project", id).
				With("reason", "artifact_not_found").With("artifact_id", id.String())
		}
		if other, dup := names[f.name]; dup && other != id {
			return apierr.Validation("artifact_ids", "two artifacts are named %s; an instance places each in a directory of its name", f.name).
				With("reason", "duplicate_artifact_name").With("artifact_id", id.String())
		}
		if _, dup := names[f.name]; dup {
			return apierr.Validation("artifact_ids", "artifact %s is named twice", id).
				With("reason", "duplicate_artifact_id").With("artifact_id", id.String())
		}
		names[f.name] = id
		files += f.files
	}
	if files > apptask.MaxArtifactFiles {
		return apierr.Validation("artifact_ids", "the artifacts have %d files; an instance mounts at most %d", files, apptask.MaxArtifactFiles).
			With("reason", "too_many_files")
	}
	return nil
}
