package sampler

import "math"

// expNeg returns e^x for x ≤ 0 (0 below -87, where float32 underflows),
// with relative error below 2e-7: x = n·ln2 + f with |f| ≤ ln2/2, e^f by a
// degree-7 Taylor polynomial, 2^n through the exponent bits. About five
// times cheaper than math.Exp, and softmax over a 6000-token vocabulary
// runs for every sample of every step.
func expNeg(x float32) float32 {
	if x < -87 {
		return 0
	}
	const log2e = 1.4426950408889634
	const ln2hi, ln2lo = 0.693145751953125, 1.428606765330187e-06
	// Round x·log2e to an integer n by truncating toward zero after a -0.5
	// shift (x ≤ 0): |f| stays ≤ ln2/2 up to rounding, and no float64 floor.
	n := float32(int32(x*log2e - 0.5))
	f := x - n*ln2hi - n*ln2lo
	p := 1 + f*(1+f*(1.0/2+f*(1.0/6+f*(1.0/24+f*(1.0/120+f*(1.0/720+f*(1.0/5040)))))))
	return p * math.Float32frombits(uint32(int32(n)+127)<<23)
}
