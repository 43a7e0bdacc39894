// Package packages serves the node agent's Debian package and its checksum
// (GET /api/v1/node-agent/package and .../package.sha256) to cloud-init on machines
// MAAS deploys: they can reach only the control plane. The package is a file built by
// deploy/packaging (make package), named by GANTRY_NODEAGENT_PACKAGE; without one both
// operations answer 503 service_unavailable.
//
// The checksum is computed from the file the control plane serves, never taken from a
// side file, and recomputed when the file changes (size or modification time), so the
// two answers always describe the same bytes an operator last installed.
package packages

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Handlers implements GetNodeAgentPackage and GetNodeAgentPackageChecksum.
type Handlers struct {
	path string

	mu     sync.Mutex
	size   int64
	mtime  time.Time
	sum    string
	cached bool
}

// New serves the package at path ("" serves nothing: 503).
func New(path string) *Handlers { return &Handlers{path: path} }

// Path is the package file served ("" when none is configured).
func (h *Handlers) Path() string { return h.path }

func unavailable() error {
	return apierr.New(apierr.ServiceUnavailable, "no node agent package is configured on this control plane (GANTRY_NODEAGENT_PACKAGE)")
}

// open opens the package and returns it with its size and SHA-256, recomputing the sum
// only when the file changed since the last call.
func (h *Handlers) open() (*os.File, int64, string, error) {
	if h.path == "" {
		return nil, 0, "", unavailable()
	}
	f, err := os.Open(h.path)
	if err != nil {
		return nil, 0, "", apierr.New(apierr.ServiceUnavailable, "the node agent package is not readable").Wrap(err)
	}
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, 0, "", apierr.New(apierr.ServiceUnavailable, "the node agent package is not a regular file")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.cached || h.size != st.Size() || !h.mtime.Equal(st.ModTime()) {
		hash := sha256.New()
		if _, err := io.Copy(hash, f); err != nil {
			f.Close()
			return nil, 0, "", fmt.Errorf("hash the node agent package: %w", err)
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			f.Close()
			return nil, 0, "", err
		}
		h.sum, h.size, h.mtime, h.cached = hex.EncodeToString(hash.Sum(nil)), st.Size(), st.ModTime(), true
	}
	return f, st.Size(), h.sum, nil
}

// GetNodeAgentPackage streams the .deb.
func (h *Handlers) GetNodeAgentPackage(ctx context.Context, _ api.GetNodeAgentPackageRequestObject) (api.GetNodeAgentPackageResponseObject, error) {
	f, size, _, err := h.open()
	if err != nil {
		return nil, err
	}
	// The generated response closes the body (the file) once it is written; the limit
	// keeps the body at the length announced even if the file grows meanwhile.
	body := struct {
		io.Reader
		io.Closer
	}{io.LimitReader(f, size), f}
	return api.GetNodeAgentPackage200ApplicationVndDebianBinaryPackageResponse{Body: body, ContentLength: size}, nil
}

// GetNodeAgentPackageChecksum answers "<sha256>  <file name>\n" (sha256sum's format).
func (h *Handlers) GetNodeAgentPackageChecksum(ctx context.Context, _ api.GetNodeAgentPackageChecksumRequestObject) (api.GetNodeAgentPackageChecksumResponseObject, error) {
	f, _, sum, err := h.open()
	if err != nil {
		return nil, err
	}
	f.Close()
	return api.GetNodeAgentPackageChecksum200TextResponse{Body: sum + "  " + filepath.Base(h.path) + "\n"}, nil
}
