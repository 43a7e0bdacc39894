package maas

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

func regexpMust(s string) *regexp.Regexp { return regexp.MustCompile(s) }

// Profile is an onboarding recipe (also stored, frozen, in each onboarding).
type Profile struct {
	ID            uuid.UUID `json:"id"`
	Name          string    `json:"name"`
	OSImageID     uuid.UUID `json:"os_image_id"`
	OSystem       string    `json:"osystem"`
	DistroSeries  string    `json:"distro_series"`
	HWEKernel     *string   `json:"hwe_kernel"`
	StorageLayout string    `json:"storage_layout"`
	AgentRuntime  string    `json:"agent_runtime"`
	Labels        []string  `json:"labels"`
	Region        *string   `json:"region"`
	SKUs          []string  `json:"skus"`
	CreatedAt     time.Time `json:"created_at"`
	UpdatedAt     time.Time `json:"updated_at"`
}

// ProfileSpec creates or (non-nil fields) changes a profile.
type ProfileSpec struct {
	Name          *string
	OSImageID     *uuid.UUID
	DistroSeries  *string
	ClearSeries   bool
	HWEKernel     *string
	ClearKernel   bool
	StorageLayout *string
	Labels        []string
	SetLabels     bool
	Region        *string
	ClearRegion   bool
	SKUs          []string
}

// ubuntuSeries maps Ubuntu versions (the OS image's version) to MAAS distro series.
var ubuntuSeries = map[string]string{"20.04": "focal", "22.04": "jammy", "24.04": "noble", "24.10": "oracular", "25.04": "plucky"}

const profileCols = `id, name, os_image_id, osystem, distro_series, hwe_kernel, storage_layout, agent_runtime, labels, region, skus, created_at, updated_at`

func scanProfile(row pgx.Row) (Profile, error) {
	var p Profile
	err := row.Scan(&p.ID, &p.Name, &p.OSImageID, &p.OSystem, &p.DistroSeries, &p.HWEKernel, &p.StorageLayout, &p.AgentRuntime,
		&p.Labels, &p.Region, &p.SKUs, &p.CreatedAt, &p.UpdatedAt)
	if p.Labels == nil {
		p.Labels = []string{}
	}
	return p, err
}

func profileNotFound() error {
	return apierr.New(apierr.InvalidRequest, "onboarding profile not found").With("reason", "not_found").WithStatus(404)
}

// GetProfile is one profile.
func (s *Service) GetProfile(ctx context.Context, id uuid.UUID) (Profile, error) {
	p, err := scanProfile(db.Querier(ctx, s.Pool).QueryRow(ctx, `SELECT `+profileCols+` FROM maas_profiles WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return p, profileNotFound()
	}
	if err != nil {
		return p, fmt.Errorf("get profile: %w", err)
	}
	return p, nil
}

// ListProfiles is a page of profiles by name.
func (s *Service) ListProfiles(ctx context.Context, after string, limit int) ([]Profile, bool, error) {
	rows, err := db.Querier(ctx, s.Pool).Query(ctx, `SELECT `+profileCols+` FROM maas_profiles WHERE name > $1 ORDER BY name LIMIT $2`, after, limit+1)
	if err != nil {
		return nil, false, err
	}
	defer rows.Close()
	var out []Profile
	for rows.Next() {
		p, err := scanProfile(rows)
		if err != nil {
			return nil, false, err
		}
		out = append(out, p)
	}
	more := len(out) > limit
	if more {
		out = out[:limit]
	}
	return out, more, rows.Err()
}

// resolve fills the MAAS osystem/series of p from its OS image and checks its SKUs.
func (s *Service) resolve(ctx context.Context, p *Profile, seriesGiven bool) error {
	im, err := s.Catalog.GetOSImage(ctx, p.OSImageID)
	if err != nil {
		if ae, ok := apierr.As(err); ok && ae.HTTPStatus() == 404 {
			return apierr.Validation("os_image_id", "OS image not found").With("reason", "os_image_not_found")
		}
		return err
	}
	p.OSystem = im.Distribution
	if !seriesGiven {
		series, ok := ubuntuSeries[im.Version]
		if !ok {
			series = strings.ToLower(im.Version)
		}
		p.DistroSeries = series
	}
	for _, id := range p.SKUs {
		if _, err := s.Catalog.GetSKU(ctx, id); err != nil {
			if ae, ok := apierr.As(err); ok && ae.HTTPStatus() == 404 {
				return apierr.Validation("skus", "SKU %q does not exist", id).With("reason", "sku_not_found")
			}
			return err
		}
	}
	if p.Region != nil {
		if err := s.validateRegion(ctx, "region", *p.Region); err != nil {
			return err
		}
	}
	return nil
}

// CreateProfile stores a profile.
func (s *Service) CreateProfile(ctx context.Context, spec ProfileSpec) (Profile, error) {
	p := Profile{ID: s.IDs.New(), Name: deref(spec.Name), OSImageID: *spec.OSImageID, HWEKernel: spec.HWEKernel,
		StorageLayout: "flat", AgentRuntime: "linux-user", Labels: spec.Labels, Region: spec.Region, SKUs: spec.SKUs}
	if !nameRE.MatchString(p.Name) {
		return Profile{}, apierr.Validation("name", "name must match ^[a-z0-9][a-z0-9-]{0,63}$")
	}
	if len(p.SKUs) == 0 {
		return Profile{}, apierr.Validation("skus", "a profile offers at least one SKU")
	}
	if spec.StorageLayout != nil {
		p.StorageLayout = *spec.StorageLayout
	}
	if p.Labels == nil {
		p.Labels = []string{}
	}
	if spec.DistroSeries != nil {
		p.DistroSeries = *spec.DistroSeries
	}
	if err := s.resolve(ctx, &p, spec.DistroSeries != nil); err != nil {
		return Profile{}, err
	}
	now := s.now()
	p.CreatedAt, p.UpdatedAt = now, now
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO maas_profiles (`+profileCols+`) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13)`,
			p.ID, p.Name, p.OSImageID, p.OSystem, p.DistroSeries, p.HWEKernel, p.StorageLayout, p.AgentRuntime, p.Labels, p.Region, p.SKUs, now, now)
		if isUnique(err) {
			return apierr.New(apierr.InvalidRequest, "a profile with this name exists").With("reason", "maas_profile_exists").WithStatus(409)
		}
		if err != nil {
			return fmt.Errorf("insert profile: %w", err)
		}
		return s.changed(ctx, tx, "maas.profile.create", "maas_profile", p.ID.String(), "maas.profile.created",
			map[string]any{"name": p.Name, "skus": p.SKUs})
	})
	if err != nil {
		return Profile{}, err
	}
	return p, nil
}

// UpdateProfile changes a profile (running onboardings keep their frozen recipe).
func (s *Service) UpdateProfile(ctx context.Context, id uuid.UUID, spec ProfileSpec) (Profile, error) {
	cur, err := s.GetProfile(ctx, id)
	if err != nil {
		return Profile{}, err
	}
	next := cur
	if spec.Name != nil {
		if !nameRE.MatchString(*spec.Name) {
			return Profile{}, apierr.Validation("name", "name must match ^[a-z0-9][a-z0-9-]{0,63}$")
		}
		next.Name = *spec.Name
	}
	if spec.OSImageID != nil {
		next.OSImageID = *spec.OSImageID
	}
	seriesGiven := true
	if spec.DistroSeries != nil {
		next.DistroSeries = *spec.DistroSeries
	} else if spec.ClearSeries || spec.OSImageID != nil {
		seriesGiven = false
	}
	if spec.ClearKernel {
		next.HWEKernel = nil
	} else if spec.HWEKernel != nil {
		next.HWEKernel = spec.HWEKernel
	}
	if spec.StorageLayout != nil {
		next.StorageLayout = *spec.StorageLayout
	}
	if spec.SetLabels {
		next.Labels = spec.Labels
		if next.Labels == nil {
			next.Labels = []string{}
		}
	}
	if spec.ClearRegion {
		next.Region = nil
	} else if spec.Region != nil {
		next.Region = spec.Region
	}
	if spec.SKUs != nil {
		next.SKUs = spec.SKUs
	}
	if err := s.resolve(ctx, &next, seriesGiven); err != nil {
		return Profile{}, err
	}
	if fmt.Sprint(next) == fmt.Sprint(cur) {
		return cur, nil
	}
	next.UpdatedAt = s.now()
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE maas_profiles SET name=$2, os_image_id=$3, osystem=$4, distro_series=$5, hwe_kernel=$6,
			storage_layout=$7, labels=$8, region=$9, skus=$10, updated_at=$11 WHERE id = $1`,
			id, next.Name, next.OSImageID, next.OSystem, next.DistroSeries, next.HWEKernel, next.StorageLayout, next.Labels, next.Region, next.SKUs, next.UpdatedAt)
		if isUnique(err) {
			return apierr.New(apierr.InvalidRequest, "a profile with this name exists").With("reason", "maas_profile_exists").WithStatus(409)
		}
		if err != nil {
			return fmt.Errorf("update profile: %w", err)
		}
		return s.changed(ctx, tx, "maas.profile.update", "maas_profile", id.String(), "maas.profile.updated", map[string]any{"name": next.Name})
	})
	if err != nil {
		return Profile{}, err
	}
	return next, nil
}

// DeleteProfile removes a profile no onboarding in progress uses.
func (s *Service) DeleteProfile(ctx context.Context, id uuid.UUID) error {
	return db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		var name string
		err := tx.QueryRow(ctx, `SELECT name FROM maas_profiles WHERE id = $1 FOR UPDATE`, id).Scan(&name)
		if errors.Is(err, pgx.ErrNoRows) {
			return profileNotFound()
		}
		if err != nil {
			return err
		}
		var used bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM maas_onboardings WHERE profile_id = $1)`, id).Scan(&used); err != nil {
			return err
		}
		if used {
			return apierr.New(apierr.InvalidRequest, "onboardings refer to this profile").With("reason", "maas_profile_in_use").WithStatus(409)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM maas_profiles WHERE id = $1`, id); err != nil {
			return err
		}
		return s.changed(ctx, tx, "maas.profile.delete", "maas_profile", id.String(), "maas.profile.deleted", map[string]any{"name": name})
	})
}
