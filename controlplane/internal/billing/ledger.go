package billing

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/billing/billingdb"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/clock"
	"github.com/gantry-gpu/gantry/shared/correlation"
	"github.com/gantry-gpu/gantry/shared/ids"
)

// Account kinds.
const (
	AccountWallet          = "tenant_wallet"     // a tenant's prepaid balance; never below zero
	AccountReceivable      = "tenant_receivable" // usage the wallet could not cover (negative: owed)
	AccountRevenue         = "platform_revenue"
	AccountPaymentClearing = "payment_clearing"
	AccountFX              = "fx"
	AccountAdjustments     = "adjustments" // counterpart of admin credits and debits
)

// Transaction kinds.
const (
	TxnTopUp      = "top_up"
	TxnRefund     = "refund"
	TxnUsage      = "usage"
	TxnAdjustment = "adjustment"
	TxnConversion = "conversion"
	TxnReversal   = "reversal"
)

func tenantOwned(kind string) bool { return kind == AccountWallet || kind == AccountReceivable }

// AccountKey names an account: platform accounts have no tenant.
type AccountKey struct {
	Kind     string
	TenantID uuid.UUID
	Currency string
}

// Leg is one entry of a posting: a signed change of the account's balance.
type Leg struct {
	Account AccountKey
	Amount  int64
}

// Posting is one ledger transaction. Reference names what it answers for ("payment:<id>")
// and is unique: posting the same reference again posts nothing and returns the first
// transaction (Replayed).
type Posting struct {
	Kind          string
	TenantID      uuid.UUID
	Reference     string
	ReversesTxnID uuid.UUID
	FXSnapshotID  uuid.UUID
	Memo          string
	ActorUserID   uuid.UUID
	Legs          []Leg
}

// Posted is the result of a posting; EntryIDs follow Legs.
type Posted struct {
	TxnID    uuid.UUID
	EntryIDs []uuid.UUID
	Replayed bool
}

// Ledger is the double-entry ledger: immutable entries, one transaction per posting,
// every transaction summing to zero per currency (checked here and by the database at
// commit), tenant wallets never below zero (a conditional update under the row lock, and
// a CHECK constraint behind it), and balance projections updated with the entries.
type Ledger struct {
	Pool  *pgxpool.Pool
	Clock clock.Clock
	IDs   ids.Source

	accounts sync.Map // AccountKey -> uuid.UUID (committed accounts only)

	// afterCredit runs in the posting's transaction after a wallet credit (a top-up):
	// billing lifts a runway block there.
	afterCredit func(ctx context.Context, tx pgx.Tx, tenantID uuid.UUID, currency string) error
}

// ErrUnbalanced is wrapped by refusals of postings that do not sum to zero.
var ErrUnbalanced = errors.New("ledger: posting does not sum to zero per currency")

// validateLegs enforces the double-entry rules in code: at least two legs, no zero leg,
// known currencies, and a zero sum per currency.
func validateLegs(legs []Leg) error {
	if len(legs) < 2 {
		return fmt.Errorf("%w: %d legs", ErrUnbalanced, len(legs))
	}
	sums := map[string]int64{}
	for _, l := range legs {
		if l.Amount == 0 {
			return fmt.Errorf("ledger: zero leg on %s", l.Account.Kind)
		}
		if _, ok := exponents[l.Account.Currency]; !ok {
			return fmt.Errorf("ledger: unknown currency %q", l.Account.Currency)
		}
		if tenantOwned(l.Account.Kind) == (l.Account.TenantID == uuid.Nil) {
			return fmt.Errorf("ledger: account %s with tenant %s", l.Account.Kind, l.Account.TenantID)
		}
		s := sums[l.Account.Currency]
		if (l.Amount > 0 && s > (1<<62)) || (l.Amount < 0 && s < -(1<<62)) {
			return fmt.Errorf("ledger: amount out of range")
		}
		sums[l.Account.Currency] = s + l.Amount
	}
	for cur, s := range sums {
		if s != 0 {
			return fmt.Errorf("%w: %s sums to %d", ErrUnbalanced, cur, s)
		}
	}
	return nil
}

// accountID finds or creates the account with q (the posting's transaction: a second
// connection could wait on the caller's own locks or an exhausted pool). Only ids of
// committed rows are cached, so a rolled-back creation is never remembered.
func (l *Ledger) accountID(ctx context.Context, q *billingdb.Queries, key AccountKey) (uuid.UUID, error) {
	if id, ok := l.accounts.Load(key); ok {
		return id.(uuid.UUID), nil
	}
	tenant := uuid.NullUUID{UUID: key.TenantID, Valid: key.TenantID != uuid.Nil}
	find := billingdb.FindAccountParams{Kind: key.Kind, TenantID: tenant, Currency: key.Currency}
	row, err := q.FindAccount(ctx, find)
	if errors.Is(err, pgx.ErrNoRows) {
		var bal *int64
		if tenantOwned(key.Kind) {
			zero := int64(0)
			bal = &zero
		}
		if err = q.EnsureAccount(ctx, billingdb.EnsureAccountParams{
			ID: l.IDs.New(), Kind: key.Kind, TenantID: tenant, Currency: key.Currency,
			BalanceMinor: int8Of(bal), CreatedAt: l.Clock.Now(),
		}); err != nil {
			return uuid.Nil, fmt.Errorf("create %s account: %w", key.Kind, err)
		}
		row, err = q.FindAccount(ctx, find)
	}
	if err != nil {
		return uuid.Nil, fmt.Errorf("find %s account: %w", key.Kind, err)
	}
	if !row.Mine {
		l.accounts.Store(key, row.ID)
	}
	return row.ID, nil
}

func legKeys(legs []Leg) []AccountKey {
	out := make([]AccountKey, len(legs))
	for i, l := range legs {
		out[i] = l.Account
	}
	return out
}

// accountIDs resolves keys in one fixed order, so that two transactions creating the
// same new accounts never wait on each other crosswise.
func (l *Ledger) accountIDs(ctx context.Context, q *billingdb.Queries, keys []AccountKey) (map[AccountKey]uuid.UUID, error) {
	sorted := slices.Clone(keys)
	slices.SortFunc(sorted, func(a, b AccountKey) int {
		if c := strings.Compare(a.Kind, b.Kind); c != 0 {
			return c
		}
		if c := bytes.Compare(a.TenantID[:], b.TenantID[:]); c != 0 {
			return c
		}
		return strings.Compare(a.Currency, b.Currency)
	})
	out := make(map[AccountKey]uuid.UUID, len(keys))
	for _, k := range sorted {
		if _, ok := out[k]; ok {
			continue
		}
		id, err := l.accountID(ctx, q, k)
		if err != nil {
			return nil, err
		}
		out[k] = id
	}
	return out, nil
}

func insufficient(currency string, required int64) *apierr.Error {
	return apierr.New(apierr.InsufficientBalance, "the %s balance does not cover this amount", currency).
		With("currency", currency).With("required_minor", required)
}

// Post writes p with tx. On any error the caller must roll tx back (as after any failed
// step); insufficient_balance (402) is returned when a tenant wallet would go below zero.
func (l *Ledger) Post(ctx context.Context, tx pgx.Tx, p Posting) (Posted, error) {
	if err := validateLegs(p.Legs); err != nil {
		return Posted{}, err
	}
	if p.Reference == "" || len(p.Reference) > 300 {
		return Posted{}, fmt.Errorf("ledger: reference of %d bytes", len(p.Reference))
	}
	q := billingdb.New(tx)
	ids, err := l.accountIDs(ctx, q, legKeys(p.Legs))
	if err != nil {
		return Posted{}, err
	}
	accountIDs := make([]uuid.UUID, len(p.Legs))
	for i, leg := range p.Legs {
		accountIDs[i] = ids[leg.Account]
	}
	now := l.Clock.Now()
	txnID, err := q.InsertTxn(ctx, billingdb.InsertTxnParams{
		ID: l.IDs.New(), Kind: p.Kind, TenantID: nullUUID(p.TenantID), Reference: p.Reference,
		ReversesTxnID: nullUUID(p.ReversesTxnID), FxSnapshotID: nullUUID(p.FXSnapshotID), Memo: p.Memo,
		ActorUserID: nullUUID(p.ActorUserID), CorrelationID: correlation.ID(ctx), CreatedAt: now,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		prev, err := q.TxnByReference(ctx, p.Reference)
		if err != nil {
			return Posted{}, fmt.Errorf("ledger replay: %w", err)
		}
		if prev.Kind != p.Kind || prev.TenantID != nullUUID(p.TenantID) {
			return Posted{}, apierr.New(apierr.InvalidRequest, "this reference was posted for something else").
				WithStatus(409).With("reason", "reference_conflict")
		}
		return Posted{TxnID: prev.ID, Replayed: true}, nil
	}
	if err != nil {
		return Posted{}, fmt.Errorf("ledger transaction: %w", err)
	}
	if err := l.applyProjections(ctx, q, p.Legs, accountIDs, now); err != nil {
		return Posted{}, err
	}
	out := Posted{TxnID: txnID, EntryIDs: make([]uuid.UUID, len(p.Legs))}
	params := billingdb.InsertEntriesParams{CreatedAt: now}
	for i, leg := range p.Legs {
		out.EntryIDs[i] = l.IDs.New()
		params.Ids = append(params.Ids, out.EntryIDs[i])
		params.TxnIds = append(params.TxnIds, txnID)
		params.AccountIds = append(params.AccountIds, accountIDs[i])
		params.Currencies = append(params.Currencies, leg.Account.Currency)
		params.Amounts = append(params.Amounts, leg.Amount)
	}
	if err := q.InsertEntries(ctx, params); err != nil {
		return Posted{}, fmt.Errorf("ledger entries: %w", err)
	}
	return out, nil
}

// applyProjections moves the balance projections of the tenant accounts among legs, in
// account-id order (a fixed lock order: no deadlocks between postings).
func (l *Ledger) applyProjections(ctx context.Context, q *billingdb.Queries, legs []Leg, accountIDs []uuid.UUID, now time.Time) error {
	type delta struct {
		id       uuid.UUID
		currency string
		amount   int64
	}
	var deltas []delta
	for i, leg := range legs {
		if !tenantOwned(leg.Account.Kind) {
			continue
		}
		j := slices.IndexFunc(deltas, func(d delta) bool { return d.id == accountIDs[i] })
		if j < 0 {
			deltas = append(deltas, delta{id: accountIDs[i], currency: leg.Account.Currency})
			j = len(deltas) - 1
		}
		deltas[j].amount += leg.Amount
	}
	slices.SortFunc(deltas, func(a, b delta) int { return bytes.Compare(a.id[:], b.id[:]) })
	for _, d := range deltas {
		if d.amount == 0 {
			continue
		}
		_, err := q.ApplyToAccount(ctx, billingdb.ApplyToAccountParams{Delta: d.amount, Now: now, ID: d.id})
		if errors.Is(err, pgx.ErrNoRows) {
			return insufficient(d.currency, -d.amount)
		}
		if err != nil {
			return fmt.Errorf("ledger projection: %w", err)
		}
	}
	return nil
}

func checkPositive(field string, amountMinor int64) error {
	if amountMinor <= 0 {
		return apierr.Validation(field, "amount must be greater than zero").With("reason", "not_positive")
	}
	return nil
}

// CreditTopUp credits the tenant's wallet in currency with amountMinor (> 0, minor units
// of currency) against the payment clearing account, inside the caller's transaction.
// It is idempotent per paymentID: a repeated call returns the first posting's ledger
// transaction id and posts nothing.
func (l *Ledger) CreditTopUp(ctx context.Context, tx pgx.Tx, tenantID uuid.UUID, currency string, amountMinor int64, paymentID uuid.UUID) (ledgerTxnID uuid.UUID, err error) {
	if err := checkCurrency("currency", currency); err != nil {
		return uuid.Nil, err
	}
	if err := checkPositive("amount_minor", amountMinor); err != nil {
		return uuid.Nil, err
	}
	legs, err := l.ArrearsFirst(ctx, tx, tenantID, currency, amountMinor)
	if err != nil {
		return uuid.Nil, err
	}
	p, err := l.Post(ctx, tx, Posting{
		Kind: TxnTopUp, TenantID: tenantID, Reference: "payment:" + paymentID.String(),
		Legs: append(legs, Leg{Account: AccountKey{Kind: AccountPaymentClearing, Currency: currency}, Amount: -amountMinor}),
	})
	if err == nil && !p.Replayed && l.afterCredit != nil {
		err = l.afterCredit(ctx, tx, tenantID, currency)
	}
	return p.TxnID, err
}

// ArrearsFirst is the tenant side of money arriving (amountMinor > 0 in currency): what
// the tenant owes on its receivable (usage the wallet could not cover) is settled first,
// and only the rest reaches the wallet. It locks the wallet and then the receivable
// (rating's order: wallets first) in tx, so that concurrent credits never settle the same
// arrears twice. The caller adds the counter leg of amountMinor.
func (l *Ledger) ArrearsFirst(ctx context.Context, tx pgx.Tx, tenantID uuid.UUID, currency string, amountMinor int64) ([]Leg, error) {
	wallet := AccountKey{Kind: AccountWallet, TenantID: tenantID, Currency: currency}
	recv := AccountKey{Kind: AccountReceivable, TenantID: tenantID, Currency: currency}
	q := billingdb.New(tx)
	ids, err := l.accountIDs(ctx, q, []AccountKey{wallet, recv})
	if err != nil {
		return nil, err
	}
	var owed int64
	if _, err := tx.Exec(ctx, `SELECT 1 FROM billing_ledger_accounts WHERE id = $1 FOR UPDATE`, ids[wallet]); err != nil {
		return nil, fmt.Errorf("lock wallet: %w", err)
	}
	if err := tx.QueryRow(ctx, `SELECT -balance_minor FROM billing_ledger_accounts WHERE id = $1 FOR UPDATE`, ids[recv]).Scan(&owed); err != nil {
		return nil, fmt.Errorf("lock receivable: %w", err)
	}
	settle := min(max(owed, 0), amountMinor)
	var legs []Leg
	if settle > 0 {
		legs = append(legs, Leg{Account: recv, Amount: settle})
	}
	if rest := amountMinor - settle; rest > 0 {
		legs = append(legs, Leg{Account: wallet, Amount: rest})
	}
	return legs, nil
}

// Arrears is what the tenant's receivable in currency owes (>= 0).
func (l *Ledger) Arrears(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, tenantID uuid.UUID, currency string) (int64, error) {
	var owed int64
	err := q.QueryRow(ctx, `SELECT COALESCE(max(-balance_minor), 0) FROM billing_ledger_accounts
		WHERE kind = 'tenant_receivable' AND tenant_id = $1 AND currency = $2`, tenantID, currency).Scan(&owed)
	return max(owed, 0), err
}

// DebitRefund debits the tenant's wallet in currency with amountMinor (> 0) towards the
// payment clearing account, inside the caller's transaction. It is idempotent per
// refundID. It refuses with insufficient_balance (402, an *apierr.Error) when the wallet
// cannot cover the amount: a wallet never goes below zero, so credit already spent on
// usage cannot be refunded from it. On an error the caller rolls its transaction back.
func (l *Ledger) DebitRefund(ctx context.Context, tx pgx.Tx, tenantID uuid.UUID, currency string, amountMinor int64, refundID uuid.UUID) (ledgerTxnID uuid.UUID, err error) {
	if err := checkCurrency("currency", currency); err != nil {
		return uuid.Nil, err
	}
	if err := checkPositive("amount_minor", amountMinor); err != nil {
		return uuid.Nil, err
	}
	p, err := l.Post(ctx, tx, Posting{
		Kind: TxnRefund, TenantID: tenantID, Reference: "refund:" + refundID.String(),
		Legs: []Leg{
			{Account: AccountKey{Kind: AccountWallet, TenantID: tenantID, Currency: currency}, Amount: -amountMinor},
			{Account: AccountKey{Kind: AccountPaymentClearing, Currency: currency}, Amount: amountMinor},
		},
	})
	return p.TxnID, err
}

// Reverse posts the reversal of transaction txnID: every entry negated, linked to the
// original (at most one reversal per transaction; a reversal is not reversed). A
// reversal that would take a wallet below zero is refused with insufficient_balance.
func (l *Ledger) Reverse(ctx context.Context, tx pgx.Tx, txnID uuid.UUID, memo string, actor uuid.UUID) (Posted, error) {
	q := billingdb.New(tx)
	orig, err := q.GetTxn(ctx, txnID)
	if errors.Is(err, pgx.ErrNoRows) {
		return Posted{}, apierr.New(apierr.InvalidRequest, "ledger transaction not found").WithStatus(404).With("reason", "not_found")
	}
	if err != nil {
		return Posted{}, fmt.Errorf("load ledger transaction: %w", err)
	}
	if orig.Kind == TxnReversal {
		return Posted{}, apierr.New(apierr.InvalidRequest, "a reversal cannot be reversed").WithStatus(409).With("reason", "is_reversal")
	}
	entries, err := q.TxnEntries(ctx, txnID)
	if err != nil {
		return Posted{}, fmt.Errorf("load ledger entries: %w", err)
	}
	p := Posting{Kind: TxnReversal, TenantID: orig.TenantID.UUID, Reference: "reversal:" + txnID.String(),
		ReversesTxnID: txnID, Memo: memo, ActorUserID: actor}
	for _, e := range entries {
		p.Legs = append(p.Legs, Leg{
			Account: AccountKey{Kind: e.AccountKind, TenantID: e.AccountTenantID.UUID, Currency: e.Currency},
			Amount:  -e.AmountMinor,
		})
	}
	return l.Post(ctx, tx, p)
}

func nullUUID(id uuid.UUID) uuid.NullUUID { return uuid.NullUUID{UUID: id, Valid: id != uuid.Nil} }

func int8Of(v *int64) pgtype.Int8 {
	if v == nil {
		return pgtype.Int8{}
	}
	return pgtype.Int8{Int64: *v, Valid: true}
}
