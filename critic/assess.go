package critic

// Assessment is every score of one couplet, for a reranker that weighs
// them together.
type Assessment struct {
	Parallelism float64 // Parallelism(upper, lower), in [0, 1]
	Festive     float64 // Festive of the two lines (nats per unit; > 0 reads festive)
	// Unsuitable are the unsuitable.txt entries found in the lines or the
	// 横批; BannerUnsuitable reports UnsuitableBanner(banner).
	Unsuitable       []string
	BannerUnsuitable bool
}

// Assess scores a finished couplet; banner may be "".
func Assess(upper, lower, banner string) Assessment {
	a := Assessment{
		Parallelism: Parallelism(upper, lower),
		Festive:     Festive(upper + "\t" + lower),
		Unsuitable:  Unsuitable(upper + "\t" + lower + "\t" + banner),
	}
	if banner != "" {
		a.BannerUnsuitable = UnsuitableBanner(banner)
	}
	return a
}
