-- The catalog (issue 5): regions, SKUs and OS images. Placement and the catalog read
-- nodes.region against catalog_regions.code and node_gpus.model against
-- catalog_skus.gpu_model; neither is a foreign key (nodes are administered apart).

-- +goose Up
CREATE TABLE catalog_regions (
    code                text PRIMARY KEY CHECK (code ~ '^[a-z0-9][a-z0-9-]{0,63}$'),
    api_region_code     text NOT NULL CHECK (api_region_code ~ '^[a-z0-9][a-z0-9-]{0,63}$'),
    label               text NOT NULL CHECK (char_length(label) BETWEEN 1 AND 120),
    is_default          boolean NOT NULL DEFAULT false,
    availability_state  text NOT NULL DEFAULT 'available'
                        CHECK (availability_state IN ('available', 'planned', 'maintenance', 'disabled')),
    capacity_scope_hint text CHECK (char_length(capacity_scope_hint) BETWEEN 1 AND 255),
    created_at          timestamptz NOT NULL,
    updated_at          timestamptz NOT NULL
);
CREATE UNIQUE INDEX catalog_regions_one_default ON catalog_regions (is_default) WHERE is_default;

CREATE TABLE catalog_skus (
    id           text PRIMARY KEY CHECK (char_length(id) <= 64 AND id ~ '^[a-z0-9]([a-z0-9-]*[a-z0-9])?\.[1-9][0-9]?x$'),
    display_name text NOT NULL CHECK (char_length(display_name) BETWEEN 1 AND 120),
    gpu_model    text NOT NULL CHECK (char_length(gpu_model) BETWEEN 1 AND 128),
    gpu_count    integer NOT NULL CHECK (gpu_count BETWEEN 1 AND 16),
    vcpu         integer NOT NULL CHECK (vcpu BETWEEN 1 AND 1024),
    memory_gib   integer NOT NULL CHECK (memory_gib BETWEEN 1 AND 65536),
    disk_gib     integer NOT NULL CHECK (disk_gib BETWEEN 1 AND 1048576),
    -- Priced per GPU-second by the billing pricing plan (billing_prices.usage_unit).
    usage_unit   text NOT NULL CHECK (usage_unit ~ '^[a-z0-9][a-z0-9._:-]{0,63}$'),
    -- Region codes (catalog_regions.code), checked on write; regions are never deleted.
    regions      text[] NOT NULL DEFAULT '{}' CHECK (cardinality(regions) <= 64),
    active       boolean NOT NULL DEFAULT true,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL
);

CREATE TABLE catalog_os_images (
    id           uuid PRIMARY KEY,
    name         text NOT NULL UNIQUE CHECK (name ~ '^[a-z0-9][a-z0-9._-]{0,63}$'),
    display_name text NOT NULL CHECK (char_length(display_name) BETWEEN 1 AND 120),
    distribution text NOT NULL CHECK (distribution ~ '^[a-z0-9][a-z0-9-]{0,31}$'),
    version      text NOT NULL CHECK (version ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,31}$'),
    image_ref    text NOT NULL CHECK (char_length(image_ref) BETWEEN 1 AND 512),
    is_default   boolean NOT NULL DEFAULT false,
    active       boolean NOT NULL DEFAULT true,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL
);
CREATE UNIQUE INDEX catalog_os_images_one_default ON catalog_os_images (is_default) WHERE is_default;

-- +goose Down
DROP TABLE catalog_os_images;
DROP TABLE catalog_skus;
DROP TABLE catalog_regions;
