package critic

// Judge bundles the package's signals as one value, for callers that take
// them through an interface (couplet.WithJudge). It holds no state.
type Judge struct{}

// Parallelism is the package function Parallelism.
func (Judge) Parallelism(upper, lower string) float64 { return Parallelism(upper, lower) }

// Unsuitable is the package function Unsuitable.
func (Judge) Unsuitable(text string) []string { return Unsuitable(text) }

// Festive is the package function Festive.
func (Judge) Festive(text string) float64 { return Festive(text) }
