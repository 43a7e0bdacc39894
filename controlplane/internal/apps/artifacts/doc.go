// Package artifacts owns app artifacts (docs/apps.md, Artifacts): named, versioned file
// sets of a project (a notebook, model weights, a config) that app instances mount
// read-only. Bytes stream through the object store's blob driver (never held whole);
// each file's SHA-256 is computed as it arrives and checked again on every read, so
// stored bytes that changed are never served as if they were the artifact.
//
// It never overwrites a file (a version is immutable once a path is written) and never
// serves a file whose bytes no longer match their digest.
package artifacts
