package quality

import (
	"math"
	"strings"
	"testing"
)

func TestDistinct2(t *testing.T) {
	// 春风春风: bigrams 春风 风春 春风 → 2 distinct of 3; 福到: 1 of 1.
	if got := Distinct2([]string{"春风春风", "福到"}); math.Abs(got-0.75) > 1e-12 {
		t.Errorf("Distinct2 = %v, want 3/4", got)
	}
	if got := Distinct2([]string{"福"}); got != 0 {
		t.Errorf("Distinct2 of one character = %v", got)
	}
}

func TestOverlap(t *testing.T) {
	if got := Overlap("春满人间", "新春柳绿千山绿盛世花红万户红"); got != 0.25 {
		t.Errorf("Overlap = %v, want 1/4", got)
	}
}

func TestComputeSignals(t *testing.T) {
	ours, human := sampleCouplets()
	ours = append(ours, Couplet{SourceOurs, "平安", "离别愁绪千般苦", "欢聚亲情万里长", "一路平安"})
	real := func(b string) bool { return b == "吉星高照" || b == "春满人间" }
	train := map[string]bool{"门纳平安开泰运\t户迎富贵纳祯祥": true}
	s := ComputeSignals(SourceOurs, ours, real, train)
	if s.N != 4 || s.Banners != 4 {
		t.Fatalf("%+v", s)
	}
	if s.Unsuitable != 0.25 {
		t.Errorf("unsuitable share %v, want 1/4 (离别, 愁)", s.Unsuitable)
	}
	if s.BannerReal != 0.5 || s.BannerUnsuitable != 0.5 { // 富贵在天, 一路平安
		t.Errorf("banner real %v unsuitable %v, want 1/2 and 1/2", s.BannerReal, s.BannerUnsuitable)
	}
	if s.Copied != 0.25 {
		t.Errorf("copied %v, want 1/4", s.Copied)
	}
	if s.Distinct2Per != 4.0/3 || s.Parallelism <= 0 || s.Parallelism > 1 {
		t.Errorf("distinct-2 per word %v, parallelism %v", s.Distinct2Per, s.Parallelism)
	}
	h := ComputeSignals(SourceHuman, human, nil, nil)
	if h.BannerReal != -1 || h.Copied != -1 || h.Banners != 2 {
		t.Errorf("human without real-banner func or training pairs: %+v", h)
	}
	var b strings.Builder
	WriteSignals(&b, []Signals{s, h})
	if !strings.Contains(b.String(), "| with an unsuitable word | 25.0 % | 0.0 % |") {
		t.Errorf("report:\n%s", b.String())
	}
}
