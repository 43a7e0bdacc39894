// Package blob owns the bytes of stored objects: a Driver interface with two
// implementations, FS (files under a local directory, the embedded default) and S3 (any
// S3-compatible server, through minio-go), and the helpers every caller streams through.
// It knows nothing of buckets, paths, quota or tenants beyond the opaque keys it is given;
// PostgreSQL (package storage/objects) says which key holds which object's bytes.
//
// # Per-version opaque keys
//
// Every PUT writes a new key, Key(tenant, project, bucket uuid, version uuid), and the
// object's database row is switched to it in one transaction; the old key is deleted
// after the commit. So:
//   - a partial or aborted upload is never visible: its key is unknown to the database
//     until the bytes are complete (and a driver leaves nothing behind on failure anyway);
//   - two concurrent PUTs of one path never mix bytes and metadata: each writes its own
//     key and the row ends up naming one of them whole;
//   - a reader that opened the old version keeps reading consistent bytes while a new one
//     is written;
//   - no user input (object path, bucket_id) reaches the backend's namespace, so the
//     backend never sees "..", odd Unicode or a name too long for a filesystem. Path
//     rules live in storage/objpath, and ValidKey is checked again here regardless.
//
// # Why os.Root
//
// The fs driver opens, creates, renames and removes every file through an os.Root on its
// directory. os.Root resolves each path inside the root and refuses, at the system call,
// any step that would leave it: a ".." or a symbolic link pointing outside, even one
// planted in the tree after the driver started (by an operator, a restored backup, or a
// bug elsewhere). Key validation alone could not promise that; with os.Root the bucket
// directory is a real boundary (TestFSPlantedSymlink shows it).
//
// # Streaming
//
// Put never holds an object in memory: it copies through one pooled BufferSize (1 MiB)
// buffer, hashing (sha256, the ETag) and counting as bytes pass. The fs driver writes a
// temp file in the key's directory, fsyncs it and renames it into place; the S3 driver
// sends a PutObject of the declared size, or a multipart upload of S3PartSize parts when
// the size is unknown. A declared size is enforced inside the stream, so a body that is
// shorter or longer fails before the backend commits, as ErrSizeMismatch. On any failure,
// the request's context ending included, the temp file or multipart upload is removed.
//
// Open returns a reader for a byte range, Stat the size, Delete removes (an absent key is
// fine: deletion is retried by the garbage collector). Pattern, PutPattern and Drain are
// the write and read baselines of the storage benchmark.
//
// Nothing here may log or return object content, and nothing may build a key from user
// input: callers use Key.
package blob
