package catalog

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/gantry-gpu/gantry/controlplane/internal/catalog/catalogdb"
	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// OSImage is a stored OS image.
type OSImage = catalogdb.CatalogOsImage

var (
	imageNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)
	distroRE    = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)
	versionRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,31}$`)
)

// OSImageSpec is what an admin gives to create an OS image.
type OSImageSpec struct {
	Name         string
	DisplayName  *string // default: Name
	Distribution string
	Version      string
	ImageRef     string
	IsDefault    bool
	Active       *bool // default: true
}

// OSImagePatch changes some fields; nil leaves a field as it is.
type OSImagePatch struct {
	DisplayName *string
	Version     *string
	ImageRef    *string
	IsDefault   *bool
	Active      *bool
}

func imageNotFound() error {
	return apierr.New(apierr.InvalidRequest, "OS image not found").WithStatus(404).With("reason", "not_found")
}

func checkImage(im OSImage) error {
	switch {
	case !imageNameRE.MatchString(im.Name):
		return apierr.Validation("name", "name must match %s", imageNameRE).With("reason", "invalid_name")
	case runeLen(im.DisplayName) < 1 || runeLen(im.DisplayName) > 120:
		return apierr.Validation("display_name", "display_name has 1 to 120 characters")
	case !distroRE.MatchString(im.Distribution):
		return apierr.Validation("distribution", "distribution must match %s", distroRE)
	case !versionRE.MatchString(im.Version):
		return apierr.Validation("version", "version must match %s", versionRE)
	case runeLen(im.ImageRef) < 1 || runeLen(im.ImageRef) > 512:
		return apierr.Validation("image_ref", "image_ref has 1 to 512 characters")
	}
	return nil
}

func imageMeta(im OSImage) map[string]any {
	return map[string]any{"name": im.Name, "version": im.Version, "is_default": im.IsDefault, "active": im.Active}
}

// CreateOSImage validates spec and stores it; a default image takes the flag from the
// previous one.
func (s *Service) CreateOSImage(ctx context.Context, spec OSImageSpec) (OSImage, error) {
	in := OSImage{
		ID: s.IDs.New(), Name: spec.Name, DisplayName: spec.Name, Distribution: spec.Distribution,
		Version: spec.Version, ImageRef: spec.ImageRef, IsDefault: spec.IsDefault, Active: true,
	}
	if spec.DisplayName != nil {
		in.DisplayName = *spec.DisplayName
	}
	if spec.Active != nil {
		in.Active = *spec.Active
	}
	if err := checkImage(in); err != nil {
		return OSImage{}, err
	}
	var out OSImage
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := catalogdb.New(tx)
		now := s.now()
		if in.IsDefault {
			if err := q.LockDefaultFlag(ctx, "catalog_os_images.is_default"); err != nil {
				return fmt.Errorf("lock default flag: %w", err)
			}
			if err := q.ClearDefaultOSImage(ctx, catalogdb.ClearDefaultOSImageParams{UpdatedAt: now, ID: in.ID}); err != nil {
				return fmt.Errorf("clear default image: %w", err)
			}
		}
		var err error
		out, err = q.InsertOSImage(ctx, catalogdb.InsertOSImageParams{
			ID: in.ID, Name: in.Name, DisplayName: in.DisplayName, Distribution: in.Distribution, Version: in.Version,
			ImageRef: in.ImageRef, IsDefault: in.IsDefault, Active: in.Active, CreatedAt: now,
		})
		if errors.Is(err, pgx.ErrNoRows) {
			return apierr.New(apierr.InvalidRequest, "an OS image with this name exists").WithStatus(409).
				With("reason", "os_image_exists").With("field", "name")
		}
		if err != nil {
			return fmt.Errorf("insert os image: %w", err)
		}
		return s.changed(ctx, tx, "catalog.os_image.create", "os_image", out.ID.String(), imageMeta(out))
	})
	return out, err
}

// GetOSImage loads an OS image.
func (s *Service) GetOSImage(ctx context.Context, id uuid.UUID) (OSImage, error) {
	im, err := s.read(ctx).GetOSImage(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return OSImage{}, imageNotFound()
	}
	if err != nil {
		return OSImage{}, fmt.Errorf("load os image: %w", err)
	}
	return im, nil
}

// ListOSImages is a page of OS images by name after after ("" for the first page).
func (s *Service) ListOSImages(ctx context.Context, activeOnly bool, after string, limit int) (Page[OSImage], error) {
	var a *string
	if after != "" {
		a = &after
	}
	rows, err := s.read(ctx).ListOSImages(ctx, catalogdb.ListOSImagesParams{Limit: int32(limit + 1), After: a, ActiveOnly: activeOnly})
	if err != nil {
		return Page[OSImage]{}, fmt.Errorf("list os images: %w", err)
	}
	return page(rows, limit), nil
}

// UpdateOSImage applies p; a patch that changes nothing writes nothing.
func (s *Service) UpdateOSImage(ctx context.Context, id uuid.UUID, p OSImagePatch) (OSImage, error) {
	var out OSImage
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := catalogdb.New(tx)
		// The default flag is locked before the row, in the order creates take them.
		if p.IsDefault != nil && *p.IsDefault {
			if err := q.LockDefaultFlag(ctx, "catalog_os_images.is_default"); err != nil {
				return fmt.Errorf("lock default flag: %w", err)
			}
		}
		cur, err := q.LockOSImage(ctx, id)
		if errors.Is(err, pgx.ErrNoRows) {
			return imageNotFound()
		}
		if err != nil {
			return fmt.Errorf("lock os image: %w", err)
		}
		next := cur
		if p.DisplayName != nil {
			next.DisplayName = *p.DisplayName
		}
		if p.Version != nil {
			next.Version = *p.Version
		}
		if p.ImageRef != nil {
			next.ImageRef = *p.ImageRef
		}
		if p.IsDefault != nil {
			next.IsDefault = *p.IsDefault
		}
		if p.Active != nil {
			next.Active = *p.Active
		}
		if err := checkImage(next); err != nil {
			return err
		}
		if next == cur {
			out = cur
			return nil
		}
		now := s.now()
		if next.IsDefault && !cur.IsDefault {
			if err := q.ClearDefaultOSImage(ctx, catalogdb.ClearDefaultOSImageParams{UpdatedAt: now, ID: id}); err != nil {
				return fmt.Errorf("clear default image: %w", err)
			}
		}
		out, err = q.UpdateOSImage(ctx, catalogdb.UpdateOSImageParams{
			ID: id, DisplayName: next.DisplayName, Version: next.Version, ImageRef: next.ImageRef,
			IsDefault: next.IsDefault, Active: next.Active, UpdatedAt: now,
		})
		if err != nil {
			return fmt.Errorf("update os image: %w", err)
		}
		return s.changed(ctx, tx, "catalog.os_image.update", "os_image", id.String(), imageMeta(out))
	})
	return out, err
}

// DeleteOSImage removes an OS image. Allocations keep the image they were launched with
// by value, so nothing refers to the row.
func (s *Service) DeleteOSImage(ctx context.Context, id uuid.UUID) error {
	return db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		im, err := catalogdb.New(tx).DeleteOSImage(ctx, id)
		if errors.Is(err, pgx.ErrNoRows) {
			return imageNotFound()
		}
		if err != nil {
			return fmt.Errorf("delete os image: %w", err)
		}
		return s.changed(ctx, tx, "catalog.os_image.delete", "os_image", id.String(), imageMeta(im))
	})
}
