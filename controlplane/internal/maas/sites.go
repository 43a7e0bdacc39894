package maas

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/canonical/gomaasclient/client"
	"github.com/canonical/gomaasclient/entity"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Site is a MAAS site as stored (its keys live in maas_credentials).
type Site struct {
	ID                uuid.UUID
	Name, Region      string
	APIURL            string
	TLSVerify         bool
	CABundle          *string
	DefaultOSImageID  *uuid.UUID
	DefaultPool       *string
	DefaultZone       *string
	DefaultTags       []string
	CheckStatus       *string
	CheckReason       *string
	CheckedAt         *time.Time
	LastSyncAt        *time.Time
	CreatedAt         time.Time
	UpdatedAt         time.Time
	CredentialID      uuid.UUID
	PendingCredential *uuid.UUID
	MachineCount      int
	activeSealed      []byte
	pendingSealed     []byte
}

// Credential is one API key of a site (never the key itself).
type Credential struct {
	ID         uuid.UUID
	SiteID     uuid.UUID
	State      string
	CreatedAt  time.Time
	VerifiedAt *time.Time
	RetiredAt  *time.Time
}

// SiteSpec is a site to create.
type SiteSpec struct {
	Name, Region, APIURL, APIKey string
	TLSVerify                    bool
	CABundle                     *string
	DefaultOSImageID             *uuid.UUID
	DefaultPool, DefaultZone     *string
	DefaultTags                  []string
}

// SitePatch changes a site; nil leaves a field, Clear* set it to null.
type SitePatch struct {
	Name, Region, APIURL               *string
	TLSVerify                          *bool
	CABundle                           *string
	ClearCABundle                      bool
	DefaultOSImageID                   *uuid.UUID
	ClearDefaultOSImage                bool
	DefaultPool, DefaultZone           *string
	ClearDefaultPool, ClearDefaultZone bool
	DefaultTags                        []string
	SetDefaultTags                     bool
}

var (
	nameRE   = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,63}$`)
	apiKeyRE = regexp.MustCompile(`^[A-Za-z0-9._~+/=-]+:[A-Za-z0-9._~+/=-]+:[A-Za-z0-9._~+/=-]+$`)
)

const siteCols = `s.id, s.name, s.region, s.api_url, s.tls_verify, s.ca_bundle, s.default_os_image_id, s.default_pool,
	s.default_zone, s.default_tags, s.check_status, s.check_reason, s.checked_at, s.last_sync_at, s.created_at, s.updated_at,
	a.id, a.key_sealed, p.id, p.key_sealed,
	(SELECT count(*) FROM maas_machines m WHERE m.site_id = s.id)`

const siteFrom = ` FROM maas_sites s
	JOIN maas_credentials a ON a.site_id = s.id AND a.state = 'active'
	LEFT JOIN maas_credentials p ON p.site_id = s.id AND p.state = 'pending'`

func scanSite(row pgx.Row) (Site, error) {
	var st Site
	var pendID uuid.NullUUID
	var osImage uuid.NullUUID
	err := row.Scan(&st.ID, &st.Name, &st.Region, &st.APIURL, &st.TLSVerify, &st.CABundle, &osImage, &st.DefaultPool,
		&st.DefaultZone, &st.DefaultTags, &st.CheckStatus, &st.CheckReason, &st.CheckedAt, &st.LastSyncAt, &st.CreatedAt, &st.UpdatedAt,
		&st.CredentialID, &st.activeSealed, &pendID, &st.pendingSealed, &st.MachineCount)
	if pendID.Valid {
		st.PendingCredential = &pendID.UUID
	}
	if osImage.Valid {
		st.DefaultOSImageID = &osImage.UUID
	}
	if st.DefaultTags == nil {
		st.DefaultTags = []string{}
	}
	return st, err
}

func siteNotFound() error {
	return apierr.New(apierr.InvalidRequest, "MAAS site not found").With("reason", "not_found").WithStatus(404)
}

// GetSite is one site.
func (s *Service) GetSite(ctx context.Context, id uuid.UUID) (Site, error) {
	st, err := scanSite(db.Querier(ctx, s.Pool).QueryRow(ctx, `SELECT `+siteCols+siteFrom+` WHERE s.id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Site{}, siteNotFound()
	}
	if err != nil {
		return Site{}, fmt.Errorf("get maas site: %w", err)
	}
	return st, nil
}

// ListSites is a page of sites ordered by name, after the name given.
func (s *Service) ListSites(ctx context.Context, after string, limit int) ([]Site, bool, error) {
	rows, err := db.Querier(ctx, s.Pool).Query(ctx, `SELECT `+siteCols+siteFrom+` WHERE s.name > $1 ORDER BY s.name LIMIT $2`, after, limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("list maas sites: %w", err)
	}
	defer rows.Close()
	var out []Site
	for rows.Next() {
		st, err := scanSite(rows)
		if err != nil {
			return nil, false, fmt.Errorf("scan maas site: %w", err)
		}
		out = append(out, st)
	}
	if err := rows.Err(); err != nil {
		return nil, false, err
	}
	more := len(out) > limit
	if more {
		out = out[:limit]
	}
	return out, more, nil
}

func (s *Service) validateRegion(ctx context.Context, field, code string) error {
	if !nameRE.MatchString(code) {
		return apierr.Validation(field, "%s must match ^[a-z0-9][a-z0-9-]{0,63}$", field)
	}
	if s.Catalog == nil {
		return nil
	}
	regions, err := s.Catalog.Regions(ctx)
	if err != nil {
		return err
	}
	for _, r := range regions {
		if r.Code == code {
			return nil
		}
	}
	return apierr.Validation(field, "region %q does not exist", code).With("reason", "region_not_found")
}

func (s *Service) validateOSImage(ctx context.Context, field string, id uuid.UUID) error {
	if s.Catalog == nil {
		return nil
	}
	if _, err := s.Catalog.GetOSImage(ctx, id); err != nil {
		if apierr.CodeOf(err) != "" && apierr.CodeOf(err) != apierr.InternalError {
			return apierr.Validation(field, "OS image not found").With("reason", "os_image_not_found")
		}
		return err
	}
	return nil
}

// check runs the reachability and credential check against e: one authenticated read.
func (s *Service) check(e Endpoint) error {
	c, err := s.Dialer.Client(e)
	if err != nil {
		return err
	}
	_, err = c.Machines.Get(&entity.MachinesParams{})
	return err
}

// CreateSite checks the endpoint and key, then stores the site with its key sealed.
func (s *Service) CreateSite(ctx context.Context, spec SiteSpec) (Site, error) {
	if !nameRE.MatchString(spec.Name) {
		return Site{}, apierr.Validation("name", "name must match ^[a-z0-9][a-z0-9-]{0,63}$")
	}
	if err := s.validateRegion(ctx, "region", spec.Region); err != nil {
		return Site{}, err
	}
	if !apiKeyRE.MatchString(spec.APIKey) {
		return Site{}, apierr.Validation("api_key", "the API key must be consumer_key:token_key:token_secret")
	}
	if spec.DefaultOSImageID != nil {
		if err := s.validateOSImage(ctx, "default_os_image_id", *spec.DefaultOSImageID); err != nil {
			return Site{}, err
		}
	}
	e := Endpoint{URL: spec.APIURL, APIKey: spec.APIKey, TLSVerify: spec.TLSVerify}
	if spec.CABundle != nil {
		e.CABundle = *spec.CABundle
	}
	if err := s.check(e); err != nil {
		if ae, ok := apierr.As(err); ok && ae.Code == apierr.ValidationError {
			return Site{}, err
		}
		s.Log.WarnContext(ctx, "maas site check failed", "api_url", spec.APIURL, "err", err)
		return Site{}, upstream("site check", err)
	}
	now := s.now()
	siteID, credID := s.IDs.New(), s.IDs.New()
	sealed, err := s.seal.seal([]byte(spec.APIKey), "credential", credID)
	if err != nil {
		return Site{}, err
	}
	tags := spec.DefaultTags
	if tags == nil {
		tags = []string{}
	}
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO maas_sites (id, name, region, api_url, tls_verify, ca_bundle, default_os_image_id,
			default_pool, default_zone, default_tags, check_status, checked_at, created_at, updated_at)
			VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,'ok',$11,$11,$11)`,
			siteID, spec.Name, spec.Region, spec.APIURL, spec.TLSVerify, spec.CABundle, spec.DefaultOSImageID,
			spec.DefaultPool, spec.DefaultZone, tags, now)
		if isUnique(err) {
			return apierr.New(apierr.InvalidRequest, "a MAAS site with this name exists").With("reason", "maas_site_exists").WithStatus(409)
		}
		if err != nil {
			return fmt.Errorf("insert maas site: %w", err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO maas_credentials (id, site_id, key_sealed, state, created_at, verified_at)
			VALUES ($1,$2,$3,'active',$4,$4)`, credID, siteID, sealed, now); err != nil {
			return fmt.Errorf("insert maas credential: %w", err)
		}
		return s.changed(ctx, tx, "maas.site.create", "maas_site", siteID.String(), "maas.site.created",
			map[string]any{"name": spec.Name, "region": spec.Region, "api_url": spec.APIURL, "key_id": credID.String()})
	})
	if err != nil {
		return Site{}, err
	}
	return s.GetSite(ctx, siteID)
}

func isUnique(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505"
}

// UpdateSite applies p; a change of the endpoint is checked before it is stored.
func (s *Service) UpdateSite(ctx context.Context, id uuid.UUID, p SitePatch) (Site, error) {
	cur, err := s.GetSite(ctx, id)
	if err != nil {
		return Site{}, err
	}
	next := cur
	sets, meta := []string{}, map[string]any{}
	args := []any{id}
	set := func(col string, v any) {
		args = append(args, v)
		sets = append(sets, fmt.Sprintf("%s = $%d", col, len(args)))
		meta[col] = v
	}
	if p.Name != nil && *p.Name != cur.Name {
		if !nameRE.MatchString(*p.Name) {
			return Site{}, apierr.Validation("name", "name must match ^[a-z0-9][a-z0-9-]{0,63}$")
		}
		set("name", *p.Name)
	}
	if p.Region != nil && *p.Region != cur.Region {
		if err := s.validateRegion(ctx, "region", *p.Region); err != nil {
			return Site{}, err
		}
		set("region", *p.Region)
	}
	endpointChanged := false
	if p.APIURL != nil && *p.APIURL != cur.APIURL {
		next.APIURL = *p.APIURL
		set("api_url", *p.APIURL)
		endpointChanged = true
	}
	if p.TLSVerify != nil && *p.TLSVerify != cur.TLSVerify {
		next.TLSVerify = *p.TLSVerify
		set("tls_verify", *p.TLSVerify)
		endpointChanged = true
	}
	if p.ClearCABundle && cur.CABundle != nil {
		next.CABundle = nil
		set("ca_bundle", nil)
		meta["ca_bundle"] = "cleared"
		endpointChanged = true
	} else if p.CABundle != nil && (cur.CABundle == nil || *cur.CABundle != *p.CABundle) {
		next.CABundle = p.CABundle
		set("ca_bundle", *p.CABundle)
		meta["ca_bundle"] = "changed"
		endpointChanged = true
	}
	if p.ClearDefaultOSImage && cur.DefaultOSImageID != nil {
		set("default_os_image_id", nil)
	} else if p.DefaultOSImageID != nil && (cur.DefaultOSImageID == nil || *cur.DefaultOSImageID != *p.DefaultOSImageID) {
		if err := s.validateOSImage(ctx, "default_os_image_id", *p.DefaultOSImageID); err != nil {
			return Site{}, err
		}
		set("default_os_image_id", *p.DefaultOSImageID)
	}
	if p.ClearDefaultPool && cur.DefaultPool != nil {
		set("default_pool", nil)
	} else if p.DefaultPool != nil && (cur.DefaultPool == nil || *cur.DefaultPool != *p.DefaultPool) {
		set("default_pool", *p.DefaultPool)
	}
	if p.ClearDefaultZone && cur.DefaultZone != nil {
		set("default_zone", nil)
	} else if p.DefaultZone != nil && (cur.DefaultZone == nil || *cur.DefaultZone != *p.DefaultZone) {
		set("default_zone", *p.DefaultZone)
	}
	if p.SetDefaultTags && strings.Join(p.DefaultTags, "\x00") != strings.Join(cur.DefaultTags, "\x00") {
		tags := p.DefaultTags
		if tags == nil {
			tags = []string{}
		}
		set("default_tags", tags)
	}
	if len(sets) == 0 {
		return cur, nil
	}
	if endpointChanged {
		key, err := s.seal.open(cur.activeSealed, "credential", cur.CredentialID)
		if err != nil {
			return Site{}, err
		}
		if err := s.check(next.endpoint(string(key))); err != nil {
			if ae, ok := apierr.As(err); ok && ae.Code == apierr.ValidationError {
				return Site{}, err
			}
			s.Log.WarnContext(ctx, "maas site check failed", "site_id", id, "err", err)
			return Site{}, upstream("site check", err)
		}
	}
	args = append(args, s.now())
	sets = append(sets, fmt.Sprintf("updated_at = $%d", len(args)))
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE maas_sites SET `+strings.Join(sets, ", ")+` WHERE id = $1`, args...)
		if isUnique(err) {
			return apierr.New(apierr.InvalidRequest, "a MAAS site with this name exists").With("reason", "maas_site_exists").WithStatus(409)
		}
		if err != nil {
			return fmt.Errorf("update maas site: %w", err)
		}
		return s.changed(ctx, tx, "maas.site.update", "maas_site", id.String(), "maas.site.updated", meta)
	})
	if err != nil {
		return Site{}, err
	}
	return s.GetSite(ctx, id)
}

// DeleteSite removes a site that no workflow is using.
func (s *Service) DeleteSite(ctx context.Context, id uuid.UUID) error {
	return db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		var name string
		err := tx.QueryRow(ctx, `SELECT name FROM maas_sites WHERE id = $1 FOR UPDATE`, id).Scan(&name)
		if errors.Is(err, pgx.ErrNoRows) {
			return siteNotFound()
		}
		if err != nil {
			return fmt.Errorf("lock maas site: %w", err)
		}
		var busy bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM maas_onboardings WHERE site_id = $1 AND state IN ('pending','running','failed','aborting'))
			OR EXISTS (SELECT 1 FROM maas_decommissions WHERE site_id = $1 AND state IN ('pending','running','failed','aborting'))`, id).Scan(&busy); err != nil {
			return fmt.Errorf("maas site busy: %w", err)
		}
		if busy {
			return apierr.New(apierr.InvalidRequest, "an onboarding or decommission of this site is in progress").With("reason", "maas_site_busy").WithStatus(409)
		}
		// Finished workflows keep their history without the site.
		if _, err := tx.Exec(ctx, `UPDATE maas_decommissions SET site_id = NULL WHERE site_id = $1`, id); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM maas_onboardings WHERE site_id = $1`, id); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM maas_sites WHERE id = $1`, id); err != nil {
			return fmt.Errorf("delete maas site: %w", err)
		}
		return s.changed(ctx, tx, "maas.site.delete", "maas_site", id.String(), "maas.site.deleted", map[string]any{"name": name})
	})
}

func (st Site) endpoint(key string) Endpoint {
	e := Endpoint{URL: st.APIURL, APIKey: key, TLSVerify: st.TLSVerify}
	if st.CABundle != nil {
		e.CABundle = *st.CABundle
	}
	return e
}

// CheckSite runs the reachability and credential check now and records it.
func (s *Service) CheckSite(ctx context.Context, id uuid.UUID) (Site, error) {
	err := s.withClient(ctx, id, func(c *client.Client) error {
		_, err := c.Machines.Get(&entity.MachinesParams{})
		return err
	})
	status, reason := "ok", (*string)(nil)
	if err != nil {
		if ae, ok := apierr.As(err); ok && ae.Code != apierr.UpstreamError {
			return Site{}, err
		}
		f := Classify(errors.Unwrap(err))
		status = string(f)
		if f == FailConflict || f == FailNotFound {
			status = string(FailUpstream)
		}
		r := Reason(f)
		reason = &r
	}
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE maas_sites SET check_status = $2, check_reason = $3, checked_at = $4 WHERE id = $1`,
			id, status, reason, s.now()); err != nil {
			return err
		}
		return s.changed(ctx, tx, "maas.site.check", "maas_site", id.String(), "maas.site.checked", map[string]any{"status": status})
	})
	if err != nil {
		return Site{}, err
	}
	return s.GetSite(ctx, id)
}

// withClient runs fn with a client of the site. A pending (rotated-in) key is tried
// first: when MAAS accepts it, it becomes the active key and the old one is retired;
// when MAAS refuses it, the active key is used and the pending one stays pending.
func (s *Service) withClient(ctx context.Context, siteID uuid.UUID, fn func(c *client.Client) error) error {
	st, err := s.GetSite(ctx, siteID)
	if err != nil {
		return err
	}
	if st.PendingCredential != nil {
		key, err := s.seal.open(st.pendingSealed, "credential", *st.PendingCredential)
		if err != nil {
			return err
		}
		c, err := s.Dialer.Client(st.endpoint(string(key)))
		if err != nil {
			return err
		}
		err = fn(c)
		if err == nil || Classify(err) != FailCredentials {
			if perr := s.promote(ctx, st, *st.PendingCredential); perr != nil {
				return perr
			}
			if err != nil {
				return upstream("call", err)
			}
			return nil
		}
		s.Log.WarnContext(ctx, "maas pending credential refused; using the active one", "site_id", siteID, "credential_id", *st.PendingCredential)
	}
	key, err := s.seal.open(st.activeSealed, "credential", st.CredentialID)
	if err != nil {
		return err
	}
	c, err := s.Dialer.Client(st.endpoint(string(key)))
	if err != nil {
		return err
	}
	if err := fn(c); err != nil {
		if ae, ok := apierr.As(err); ok {
			return ae
		}
		return upstream("call", err)
	}
	return nil
}

// promote makes the pending credential the active one (it has just worked once).
func (s *Service) promote(ctx context.Context, st Site, credID uuid.UUID) error {
	now := s.now()
	return db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE maas_credentials SET state = 'retired', retired_at = $3
			WHERE site_id = $1 AND state = 'active' AND EXISTS (SELECT 1 FROM maas_credentials WHERE id = $2 AND state = 'pending')`,
			st.ID, credID, now)
		if err != nil {
			return fmt.Errorf("retire maas credential: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return nil // promoted concurrently
		}
		if _, err := tx.Exec(ctx, `UPDATE maas_credentials SET state = 'active', verified_at = $2 WHERE id = $1`, credID, now); err != nil {
			return fmt.Errorf("activate maas credential: %w", err)
		}
		return s.changed(ctx, tx, "maas.site.credential.activate", "maas_site", st.ID.String(), "maas.site.credential_activated",
			map[string]any{"key_id": credID.String(), "retired_key_id": st.CredentialID.String()})
	})
}

// RotateCredential adds key as the site's pending credential and tries it at once.
func (s *Service) RotateCredential(ctx context.Context, siteID uuid.UUID, key string) (Credential, error) {
	if !apiKeyRE.MatchString(key) {
		return Credential{}, apierr.Validation("api_key", "the API key must be consumer_key:token_key:token_secret")
	}
	if _, err := s.GetSite(ctx, siteID); err != nil {
		return Credential{}, err
	}
	credID := s.IDs.New()
	sealed, err := s.seal.seal([]byte(key), "credential", credID)
	if err != nil {
		return Credential{}, err
	}
	now := s.now()
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		// A newer rotation replaces a pending key that never worked.
		if _, err := tx.Exec(ctx, `UPDATE maas_credentials SET state = 'retired', retired_at = $2 WHERE site_id = $1 AND state = 'pending'`, siteID, now); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO maas_credentials (id, site_id, key_sealed, state, created_at) VALUES ($1,$2,$3,'pending',$4)`,
			credID, siteID, sealed, now); err != nil {
			return fmt.Errorf("insert maas credential: %w", err)
		}
		return s.changed(ctx, tx, "maas.site.credential.rotate", "maas_site", siteID.String(), "maas.site.credential_rotated",
			map[string]any{"key_id": credID.String()})
	})
	if err != nil {
		return Credential{}, err
	}
	// Try it now; a refusal leaves it pending (the active key keeps working).
	if _, err := s.CheckSite(ctx, siteID); err != nil {
		s.Log.WarnContext(ctx, "maas check after rotation failed", "site_id", siteID, "err", err)
	}
	return s.GetCredential(ctx, credID)
}

// GetCredential is one credential's metadata.
func (s *Service) GetCredential(ctx context.Context, id uuid.UUID) (Credential, error) {
	var c Credential
	err := db.Querier(ctx, s.Pool).QueryRow(ctx, `SELECT id, site_id, state, created_at, verified_at, retired_at FROM maas_credentials WHERE id = $1`, id).
		Scan(&c.ID, &c.SiteID, &c.State, &c.CreatedAt, &c.VerifiedAt, &c.RetiredAt)
	if err != nil {
		return Credential{}, fmt.Errorf("get maas credential: %w", err)
	}
	return c, nil
}
