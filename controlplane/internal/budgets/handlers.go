package budgets

// Handlers is this feature's slice of the generated strict-server interface.
type Handlers struct{}
