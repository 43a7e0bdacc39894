-- +goose Up
-- Node labels (`key=value`), set from the MAAS profile when an onboarding creates the
-- node (docs/maas.md). The element pattern is the profile's, checked where labels enter
-- (the API's schema for profiles, nodes.validateLabels); the bound is kept here too.
ALTER TABLE nodes ADD COLUMN labels text[] NOT NULL DEFAULT '{}'
    CONSTRAINT nodes_labels_bound CHECK (cardinality(labels) <= 32);

-- +goose Down
ALTER TABLE nodes DROP COLUMN labels;
