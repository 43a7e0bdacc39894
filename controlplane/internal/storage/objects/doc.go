// Package objects owns the objects of storage buckets: uploading (PUT), reading (GET,
// HEAD, with one byte range and conditional requests), deleting and listing them, over
// the HTTP API and, for attachments, the ObjectAccess interface the node fabric uses.
// PostgreSQL (storage_objects) says which blob key holds an object's current bytes; the
// bytes themselves stream between the client and the blob driver and never sit whole in
// memory, nor ever pass through PostgreSQL.
//
// # An upload
//
//  1. The caller is authorised for write before a byte of the body is read, the path
//     is cleaned (storage/objpath: traversal is 400 storage_path_traversal), a declared
//     Content-Length over the per-PUT limit is refused (413) and the preconditions are
//     checked against the current object (409/412) — all before reading the body.
//  2. Quota is reserved in PostgreSQL (storage.Service): the whole Content-Length up
//     front, or for a chunked body step by step as bytes arrive, ahead of them; a step
//     the quota cannot hold ends the upload (429 quota_exhausted).
//  3. The bytes stream into a fresh blob key (one per PUT), hashed on the way (the ETag
//     is the quoted sha256 hex).
//  4. One transaction commits: it locks the bucket (still active) and the object row,
//     decides the preconditions again (so If-None-Match: * and If-Match are atomic, not
//     just checked before the upload), points the row at the new key, settles the quota
//     (used += new - old, the reservation gone), queues the replaced key for deletion
//     and writes the audit row. After the commit the replaced key is deleted.
//
// Any failure before the commit — a body shorter or longer than its Content-Length, a
// client that disconnects, the per-PUT limit passed mid-stream, the quota exhausted, a
// precondition that no longer holds — deletes the new blob (the driver leaves nothing
// on a failed Put anyway) and frees the reservation; nothing becomes visible.
//
// # Error codes (the contract's, docs/storage.md)
//
//   - 400 storage_path_traversal; 422 validation_error for a path over 1024 bytes, an
//     empty one, or a Content-Type over 255 bytes.
//   - 404 storage_object_not_found (details.resource object) for a missing object.
//   - 409 storage_already_exists for If-None-Match: * that finds an object.
//   - 412 invalid_request (details.reason precondition_failed) for If-Match that does
//     not hold; 304 for a read whose If-None-Match matches.
//   - 413 storage_quota_exceeded (details.reason object_too_large) over the per-PUT
//     limit; 429 (quota_exhausted, details.chunked) for a Content-Length the quota
//     cannot hold, a full object count, or a chunked body that grows past the quota.
//   - 416 invalid_request (details.reason range_not_satisfiable) with Content-Range
//     bytes */size.
//   - 400 invalid_request (details.reason body_length_mismatch) for a body shorter than
//     its Content-Length, body_incomplete when the body stopped arriving.
package objects
