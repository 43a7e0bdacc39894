package audit

import "github.com/jackc/pgx/v5/pgxpool"

// Pending is the number of closed aggregates not yet written.
func (d *Denials) Pending() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.pending)
}

// SetPool swaps the database (a test brings a dead one back).
func (d *Denials) SetPool(p *pgxpool.Pool) { d.pool = p }
