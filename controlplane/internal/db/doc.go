// Package db owns the control plane's PostgreSQL schema (embedded goose migrations) and
// the transaction helper every feature uses. Features keep their own queries (sqlc, one
// package per feature); this package never holds feature logic.
package db
