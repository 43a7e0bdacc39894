-- +goose Up
-- A failed decommission no longer holds its node: the operator re-runs it by creating a
-- new decommission of the node (docs/maas.md, "When a decommission fails"); every step
-- is idempotent, and the failed row stays as the record of what went wrong.
DROP INDEX maas_decommissions_one_per_node;
CREATE UNIQUE INDEX maas_decommissions_one_per_node ON maas_decommissions (node_id)
    WHERE state IN ('pending', 'running', 'aborting');

-- +goose Down
DROP INDEX maas_decommissions_one_per_node;
CREATE UNIQUE INDEX maas_decommissions_one_per_node ON maas_decommissions (node_id)
    WHERE state IN ('pending', 'running', 'failed', 'aborting');
