-- name: InsertOutboxEvent :exec
INSERT INTO outbox_events (id, event_type, subject, payload, headers, created_at)
VALUES ($1, $2, $3, $4, $5, $6);

-- name: ClaimPendingOutboxEvents :many
-- Rows stay locked until the relay's transaction ends, so replicas never publish the
-- same event concurrently (and JetStream dedupes on the event id if one ever does).
SELECT id, event_type, subject, payload, headers, created_at, attempts
FROM outbox_events
WHERE published_at IS NULL
ORDER BY created_at, id
LIMIT $1
FOR UPDATE SKIP LOCKED;

-- name: MarkOutboxEventsPublished :exec
-- One statement for every event of a batch the relay published.
UPDATE outbox_events SET published_at = sqlc.arg('published_at'), attempts = attempts + 1, last_error = NULL
WHERE id = ANY(sqlc.arg('ids')::uuid[]);

-- name: MarkOutboxEventFailed :exec
UPDATE outbox_events SET attempts = attempts + 1, last_error = $2 WHERE id = $1;

-- name: DeletePublishedOutboxEventsBefore :execrows
DELETE FROM outbox_events WHERE published_at IS NOT NULL AND published_at < $1;
