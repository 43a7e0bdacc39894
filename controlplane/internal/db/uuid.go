package db

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ConfigurePool sets up every connection of a pool the way the control plane uses
// PostgreSQL: github.com/google/uuid values (what sqlc generates for uuid columns) are
// encoded and scanned natively. Without it pgx reaches them only through
// database/sql's interfaces: each uuid parameter is formatted as a string, fails to
// encode as one (an error built with fmt, then thrown away), is parsed back and only then
// encoded, and each scanned one is formatted and parsed again. An allocation create
// passes and reads some thirty uuids, and that detour was about a tenth of the control
// plane's CPU in the allocation benchmark (docs/allocations.md, "Performance").
func ConfigurePool(cfg *pgxpool.Config) {
	prev := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		RegisterTypes(c.TypeMap())
		if prev != nil {
			return prev(ctx, c)
		}
		return nil
	}
}

// RegisterTypes registers the uuid codec on m (ConfigurePool does it for a pool's
// connections), for uuid and uuid[].
func RegisterTypes(m *pgtype.Map) {
	elem := &pgtype.Type{Name: "uuid", OID: pgtype.UUIDOID, Codec: uuidCodec{}}
	m.RegisterType(elem)
	m.RegisterType(&pgtype.Type{Name: "_uuid", OID: pgtype.UUIDArrayOID, Codec: &pgtype.ArrayCodec{ElementType: elem}})
}

// uuidCodec is pgx's uuid codec that also knows uuid.UUID and uuid.NullUUID (and
// pointers to them) as parameters and scan targets; everything else it leaves to pgx's.
type uuidCodec struct{ pgtype.UUIDCodec }

func (c uuidCodec) PlanEncode(m *pgtype.Map, oid uint32, format int16, value any) pgtype.EncodePlan {
	switch value.(type) {
	case uuid.UUID, uuid.NullUUID:
		if format == pgtype.BinaryFormatCode {
			return encodeUUIDBinary{}
		}
		return encodeUUIDText{}
	}
	return c.UUIDCodec.PlanEncode(m, oid, format, value)
}

// present is v's uuid, or false for a NULL one.
func present(v any) (uuid.UUID, bool) {
	switch v := v.(type) {
	case uuid.UUID:
		return v, true
	case uuid.NullUUID:
		return v.UUID, v.Valid
	}
	panic(fmt.Sprintf("db: uuid plan given %T", v))
}

type encodeUUIDBinary struct{}

func (encodeUUIDBinary) Encode(v any, buf []byte) ([]byte, error) {
	u, ok := present(v)
	if !ok {
		return nil, nil
	}
	return append(buf, u[:]...), nil
}

type encodeUUIDText struct{}

func (encodeUUIDText) Encode(v any, buf []byte) ([]byte, error) {
	u, ok := present(v)
	if !ok {
		return nil, nil
	}
	return append(buf, u.String()...), nil
}

func (c uuidCodec) PlanScan(m *pgtype.Map, oid uint32, format int16, target any) pgtype.ScanPlan {
	switch target.(type) {
	case *uuid.UUID, *uuid.NullUUID:
		return scanUUID{format: format}
	}
	return c.UUIDCodec.PlanScan(m, oid, format, target)
}

type scanUUID struct{ format int16 }

func (p scanUUID) Scan(src []byte, target any) error {
	if src == nil {
		// NULL into a uuid.UUID is not an error, as through uuid's own Scanner (queries
		// whose outer joins sqlc cannot see as nullable rely on it); that left the target
		// as it was, this makes it uuid.Nil (sqlc scans into fresh values either way).
		switch t := target.(type) {
		case *uuid.NullUUID:
			*t = uuid.NullUUID{}
		case *uuid.UUID:
			*t = uuid.Nil
		}
		return nil
	}
	var u uuid.UUID
	if p.format == pgtype.BinaryFormatCode {
		if len(src) != len(u) {
			return fmt.Errorf("invalid length for uuid: %d", len(src))
		}
		copy(u[:], src)
	} else {
		var err error
		if u, err = uuid.ParseBytes(src); err != nil {
			return err
		}
	}
	switch t := target.(type) {
	case *uuid.UUID:
		*t = u
	case *uuid.NullUUID:
		*t = uuid.NullUUID{UUID: u, Valid: true}
	}
	return nil
}
