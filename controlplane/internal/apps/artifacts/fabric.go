package artifacts

import (
	"context"
	"errors"
	"io"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/proto/fabric/apptask"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// The node side of "an app instance can mount artifacts read-only": the app.start task
// lists each artifact's files with their digests (Mounts, pinned when the task is
// made), and the node agent fetches the bytes over its own fabric tunnel from
// FabricServer, never from anywhere else, so a node holds no storage credentials and a
// NATed host works (as StorageFabric does for buckets).

// Mounts is the app.start list of the artifacts ids (in that order) of projectID: every
// file with its size and SHA-256. An id that is not the project's is
// validation_error, reason artifact_not_found (as CheckProjectArtifacts).
func (s *Service) Mounts(ctx context.Context, projectID uuid.UUID, ids []uuid.UUID) ([]*fabricv1.AppArtifactMount, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	if err := s.CheckProjectArtifacts(ctx, projectID, ids); err != nil {
		return nil, err
	}
	out := make([]*fabricv1.AppArtifactMount, 0, len(ids))
	for _, id := range ids {
		a, err := s.Get(ctx, projectID, id)
		if err != nil {
			return nil, err
		}
		m := &fabricv1.AppArtifactMount{ArtifactId: a.ID.String(), Name: a.Name, Version: a.Version}
		for _, f := range a.Files {
			m.Files = append(m.Files, &fabricv1.AppArtifactFile{Path: f.Path, SizeBytes: f.SizeBytes, Sha256: f.SHA256})
		}
		out = append(out, m)
	}
	return out, nil
}

// NodeOf is the authenticated node of a fabric gRPC call (fabric.NodeID).
type NodeOf func(ctx context.Context) (uuid.UUID, bool)

// FabricServer serves fabricv1.AppArtifactFabric to node agents over their tunnels: a
// file is served only to the node an app instance that names the artifact is placed on,
// while the instance is live (not stopped or failed).
type FabricServer struct {
	fabricv1.UnimplementedAppArtifactFabricServer
	Svc    *Service
	NodeOf NodeOf
}

var _ fabricv1.AppArtifactFabricServer = (*FabricServer)(nil)

var errArtifactDenied = status.Error(codes.PermissionDenied, "no app instance on this node has such an artifact")

// chunkSize is the most bytes one Read message carries (the proto's 1 MiB bound).
const chunkSize = 1 << 20

// Read implements AppArtifactFabric.Read.
func (f *FabricServer) Read(req *fabricv1.AppArtifactReadRequest, st fabricv1.AppArtifactFabric_ReadServer) error {
	ctx := st.Context()
	nodeID, ok := f.NodeOf(ctx)
	if !ok {
		return status.Error(codes.Unauthenticated, "not a fabric tunnel")
	}
	instanceID, err1 := uuid.Parse(req.GetAppInstanceId())
	artifactID, err2 := uuid.Parse(req.GetArtifactId())
	if err1 != nil || err2 != nil {
		return errArtifactDenied
	}
	if !apptask.CleanArtifactPath(req.GetPath()) {
		return status.Error(codes.InvalidArgument, "the path is not a canonical relative path")
	}
	var projectID uuid.UUID
	err := db.Querier(ctx, f.Svc.Pool).QueryRow(ctx, `SELECT project_id FROM app_instances
		WHERE id = $1 AND node_id = $2 AND state NOT IN ('stopped', 'failed') AND $3 = ANY(artifact_ids)`,
		instanceID, nodeID, artifactID).Scan(&projectID)
	if errors.Is(err, pgx.ErrNoRows) {
		return errArtifactDenied
	}
	if err != nil {
		return status.Error(codes.Unavailable, "app instance lookup failed; retry")
	}
	file, rc, err := f.Svc.OpenFile(ctx, projectID, artifactID, req.GetPath())
	if err != nil {
		return grpcError(err)
	}
	defer rc.Close()
	info := &fabricv1.StorageObjectInfo{Path: file.Path, Size: file.SizeBytes, Etag: `"` + file.SHA256 + `"`}
	buf := make([]byte, chunkSize)
	first := true
	for {
		n, rerr := io.ReadFull(rc, buf)
		if n > 0 || first {
			msg := &fabricv1.StorageReadChunk{Data: buf[:n]}
			if first {
				msg.Info, first = info, false
			}
			if err := st.Send(msg); err != nil {
				return err
			}
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			return nil
		}
		if rerr != nil {
			return grpcError(rerr)
		}
	}
}

// grpcError maps the service's errors onto the proto's status codes.
func grpcError(err error) error {
	if errors.Is(err, ErrDigestMismatch) {
		return status.Error(codes.DataLoss, "the stored bytes do not match the file's SHA-256")
	}
	if e, ok := apierr.As(err); ok {
		switch {
		case e.Code == apierr.StorageObjectNotFound:
			return status.Error(codes.NotFound, "the artifact has no such file")
		case e.Code == apierr.InternalError:
			return status.Error(codes.DataLoss, "the artifact file's bytes are missing")
		}
	}
	return status.Error(codes.Unavailable, "the artifact store failed; retry")
}
