-- name: InsertNode :one
-- ON CONFLICT keeps the transaction usable when the name or address is taken.
INSERT INTO nodes (id, name, address, probe_port, region, last_probe_at, last_probe_reachable,
                   last_probe_latency_us, last_probe_error, created_at, updated_at, labels)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10, sqlc.arg('labels')::text[])
ON CONFLICT DO NOTHING
RETURNING *;

-- name: GetNode :one
SELECT * FROM nodes WHERE id = $1;

-- name: LockNode :one
SELECT * FROM nodes WHERE id = $1 FOR UPDATE;

-- name: ListNodes :many
SELECT * FROM nodes
WHERE (sqlc.narg('after')::uuid IS NULL OR id > sqlc.narg('after')::uuid)
ORDER BY id
LIMIT $1;

-- name: AllNodesByID :many
SELECT * FROM nodes ORDER BY id;

-- name: UpdateNodeSpec :one
UPDATE nodes SET name = $2, address = $3, probe_port = $4, region = $5, updated_at = $6
WHERE id = $1
RETURNING *;

-- name: DeleteNode :execrows
DELETE FROM nodes WHERE id = $1;

-- name: SetScheduleState :one
UPDATE nodes SET schedule_state = $2, updated_at = $3 WHERE id = $1 RETURNING *;

-- name: SetProbeResult :one
UPDATE nodes SET last_probe_at = $2, last_probe_reachable = $3, last_probe_latency_us = $4,
                 last_probe_error = $5, updated_at = $2
WHERE id = $1
RETURNING *;

-- name: SetNodeStatus :one
-- Writes only when the status differs, so a repeated report leaves the row untouched.
UPDATE nodes SET status = $2, status_changed_at = $3, last_seen_at = $3
WHERE id = $1 AND status <> $2
RETURNING *;

-- name: SetNodeIdentity :execrows
UPDATE nodes SET hostname = $2, agent_version = $3
WHERE id = $1 AND (hostname IS DISTINCT FROM $2 OR agent_version IS DISTINCT FROM $3);

-- name: MarkEnrolled :exec
UPDATE nodes SET enrolled_at = $2, hostname = $3, agent_version = $4, updated_at = $2 WHERE id = $1;

-- name: InsertEnrollmentToken :one
INSERT INTO node_enrollment_tokens (id, node_id, token_hash, created_at, expires_at)
VALUES ($1, $2, $3, $4, $5)
RETURNING *;

-- name: ConsumeEnrollmentToken :one
-- Single use: of concurrent consumers only one sees the row unused.
UPDATE node_enrollment_tokens SET used_at = $2
WHERE token_hash = $1 AND used_at IS NULL AND expires_at > $2
RETURNING *;

-- name: EnrollmentTokenByHash :one
SELECT * FROM node_enrollment_tokens WHERE token_hash = $1;

-- name: InsertNodeToken :one
INSERT INTO node_tokens (id, node_id, token_hash, created_at) VALUES ($1, $2, $3, $4) RETURNING *;

-- name: LiveNodeToken :one
SELECT * FROM node_tokens WHERE node_id = $1 AND revoked_at IS NULL;

-- name: LockLiveNodeToken :one
SELECT * FROM node_tokens WHERE node_id = $1 AND revoked_at IS NULL FOR UPDATE;

-- name: RevokeNodeTokens :execrows
UPDATE node_tokens SET revoked_at = $2, revoke_reason = $3 WHERE node_id = $1 AND revoked_at IS NULL;

-- name: NodeGPUs :many
SELECT * FROM node_gpus WHERE node_id = $1 ORDER BY gpu_index, gpu_uuid;

-- name: AllGPUs :many
SELECT * FROM node_gpus ORDER BY node_id, gpu_index, gpu_uuid;

-- name: UpsertGPU :exec
-- Keeps the telemetry columns of a GPU that stays.
INSERT INTO node_gpus (node_id, gpu_uuid, gpu_index, model, memory_bytes, pci_bus_id, mig_enabled,
                       driver_version, cuda_version)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (node_id, gpu_uuid) DO UPDATE SET
    gpu_index = EXCLUDED.gpu_index, model = EXCLUDED.model, memory_bytes = EXCLUDED.memory_bytes,
    pci_bus_id = EXCLUDED.pci_bus_id, mig_enabled = EXCLUDED.mig_enabled,
    driver_version = EXCLUDED.driver_version, cuda_version = EXCLUDED.cuda_version;

-- name: DeleteGPUs :execrows
DELETE FROM node_gpus WHERE node_id = $1 AND gpu_uuid = ANY(sqlc.arg('gpu_uuids')::text[]);

-- name: StoreTelemetry :execrows
-- One statement per report: samples for GPUs not in the inventory are ignored.
-- last_xid 0 means no XID in this sample.
UPDATE node_gpus AS g SET
    sampled_at = s.sampled_at,
    utilization_percent = s.utilization_percent,
    memory_used_bytes = s.memory_used_bytes,
    temperature_c = s.temperature_c,
    power_milliwatts = s.power_milliwatts,
    ecc_errors_corrected = s.ecc_corrected,
    ecc_errors_uncorrected = s.ecc_uncorrected,
    xid_errors_total = g.xid_errors_total + s.xid_count,
    last_xid = CASE WHEN s.last_xid > 0 THEN s.last_xid ELSE g.last_xid END,
    healthy = s.healthy
FROM (
    SELECT unnest(sqlc.arg('gpu_uuids')::text[])          AS gpu_uuid,
           unnest(sqlc.arg('sampled_at')::timestamptz[])  AS sampled_at,
           unnest(sqlc.arg('utilization')::integer[])     AS utilization_percent,
           unnest(sqlc.arg('memory_used')::bigint[])      AS memory_used_bytes,
           unnest(sqlc.arg('temperature')::integer[])     AS temperature_c,
           unnest(sqlc.arg('power')::bigint[])            AS power_milliwatts,
           unnest(sqlc.arg('ecc_corrected')::bigint[])    AS ecc_corrected,
           unnest(sqlc.arg('ecc_uncorrected')::bigint[])  AS ecc_uncorrected,
           unnest(sqlc.arg('xid_count')::bigint[])        AS xid_count,
           unnest(sqlc.arg('last_xid')::bigint[])         AS last_xid,
           unnest(sqlc.arg('healthy')::boolean[])         AS healthy
) AS s
WHERE g.node_id = sqlc.arg('node_id') AND g.gpu_uuid = s.gpu_uuid;

-- name: ExpireEnrollmentTokens :execrows
UPDATE node_enrollment_tokens SET expires_at = $2
WHERE node_id = $1 AND used_at IS NULL AND expires_at > $2;

-- name: GPUCounts :many
SELECT node_id, model, count(*) AS count FROM node_gpus
WHERE node_id = ANY(sqlc.arg('node_ids')::uuid[])
GROUP BY node_id, model
ORDER BY node_id, model;

-- Placement (placement.go).

-- name: PlacementCandidates :many
-- The nodes that can take gpu_count GPUs of model now: online, schedulable, in one of
-- regions, with their GPUs of the model that are healthy or not sampled yet and that no
-- live allocation holds (the held rows are the partial unique index
-- allocation_gpus_held_key). Best fit first: the fewest free GPUs, ties in random order
-- so that concurrent launches spread over equal nodes; at most max_nodes. One pass (one
-- anti-join): a second anti-join over the chosen nodes' GPUs turned into a nested loop
-- over every held GPU whenever the statistics still counted few held rows (a fleet that
-- filled up since the last ANALYZE), ~25 ms instead of ~6 ms. The arrays are in no
-- particular order, but pairwise (both aggregates take each row in turn); the caller
-- sorts them. An ORDER BY inside the aggregates sorted every node's GPUs on its own and
-- took 4.0 ms of a 2,000-GPU fleet's 5.7 ms (pgbench, prepared) instead of 2.3 ms.
SELECT g.node_id, n.region::text AS region,
       array_agg(g.gpu_uuid)::text[] AS gpu_uuids,
       array_agg(g.gpu_index)::integer[] AS gpu_indexes
FROM nodes n
JOIN node_gpus g ON g.node_id = n.id
WHERE n.status = 'online' AND n.schedule_state = 'schedulable'
  AND n.region = ANY(sqlc.arg('regions')::text[])
  AND g.model = sqlc.arg('model')
  AND g.healthy IS NOT FALSE
  AND NOT EXISTS (SELECT 1 FROM allocation_gpus h
                  WHERE h.node_id = g.node_id AND h.gpu_uuid = g.gpu_uuid AND h.released_at IS NULL)
GROUP BY g.node_id, n.region
HAVING count(*) >= sqlc.arg('gpu_count')::integer
ORDER BY count(*), random()
LIMIT sqlc.arg('max_nodes');
