-- name: InsertDrill :exec
INSERT INTO observability_drills (drill_id, alert_name, receiver, fired_by, fired_at)
VALUES ($1, $2, $3, $4, $5);

-- name: MarkDrillArrived :execrows
-- The first arrival counts; Alertmanager may repeat a notification.
-- A drill delivered to another receiver than its route's did not prove that route.
UPDATE observability_drills SET arrived_at = @arrived_at
WHERE drill_id = @drill_id AND receiver = @receiver AND arrived_at IS NULL;

-- name: GetDrill :one
SELECT drill_id, alert_name, receiver, fired_at, arrived_at FROM observability_drills WHERE drill_id = $1;

-- name: LatestArrivals :many
-- Per receiver, the latest drill that arrived.
SELECT receiver, max(arrived_at)::timestamptz AS last_arrived_at
FROM observability_drills
WHERE arrived_at IS NOT NULL
GROUP BY receiver;

-- name: PendingReceivers :many
-- Receivers with a drill fired after fired_after that has not arrived, and no later
-- arrival there.
SELECT DISTINCT d.receiver
FROM observability_drills d
WHERE d.arrived_at IS NULL AND d.fired_at > @fired_after
  AND NOT EXISTS (SELECT 1 FROM observability_drills a
                  WHERE a.receiver = d.receiver AND a.arrived_at IS NOT NULL AND a.fired_at >= d.fired_at);
