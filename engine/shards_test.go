package engine

import (
	"context"
	"reflect"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

// Requests through two sharded engines give what the naive engine gives.
func TestShardsMatchNaive(t *testing.T) {
	const vocab = 24
	reqs := genRequests(21, 32, vocab, 20, 24)
	want := runConcurrent(t, NewNaive(newFake(512, 4, vocab)), reqs)
	var es []*Paged
	for range 2 {
		e, err := New(newFake(512, 4, vocab), Config{EnablePrefixCaching: true})
		if err != nil {
			t.Fatal(err)
		}
		es = append(es, e)
	}
	sh := NewShards(es[0], es[1])
	sh.packBelow = 0 // least busy: the requests spread over both engines
	got := runConcurrent(t, sh, reqs)
	for i := range reqs {
		if err := sameResult(got[i], want[i]); err != nil {
			t.Errorf("request %d: %v", i, err)
		}
	}
	st := sh.Stats()
	if st.Steps != es[0].Stats().Steps+es[1].Stats().Steps {
		t.Errorf("shard steps %d, want the engines' sum", st.Steps)
	}
	for _, e := range es {
		checkDrained(t, e) // closes e; sh.Close then closes it again
	}
	if err := sh.Close(); err != nil {
		t.Fatal(err)
	}
}

// gateEngine counts its requests and holds each until release is closed.
type gateEngine struct {
	calls   atomic.Int64
	release chan struct{}
}

func (g *gateEngine) Generate(context.Context, *Request) (*Result, error) {
	g.calls.Add(1)
	<-g.release
	return &Result{}, nil
}
func (g *gateEngine) Stats() Stats { return Stats{} }
func (g *gateEngine) Close() error { return nil }

// Requests fill the engines in order up to packBelow each, then go to the
// engine with the fewest in flight (the lowest index on a tie). With
// requests held open, sent one after another to three engines: nothing
// packed spreads five as 2, 2, 1; packBelow 3 puts three on the first
// engine and two on the second; packBelow 2 fills each to 2, then spreads
// the last two by load.
func TestShardsPackThenLeastBusy(t *testing.T) {
	for _, tc := range []struct {
		pack int64
		n    int
		want []int64
	}{
		{0, 5, []int64{2, 2, 1}},
		{1, 5, []int64{2, 2, 1}},
		{3, 5, []int64{3, 2, 0}},
		{2, 8, []int64{3, 3, 2}},
	} {
		got := sendHeld(t, tc.pack, tc.n)
		if !slices.Equal(got, tc.want) {
			t.Errorf("packBelow %d, %d requests: per engine %v, want %v", tc.pack, tc.n, got, tc.want)
		}
	}
}

// sendHeld sends n requests one after another to three gate engines
// behind a Shards with the given packBelow, holding them all open, and
// returns how many each engine took.
func sendHeld(t *testing.T, pack int64, n int) []int64 {
	release := make(chan struct{})
	gs := []*gateEngine{{release: release}, {release: release}, {release: release}}
	sh := NewShards(gs[0], gs[1], gs[2])
	sh.packBelow = pack
	var wg sync.WaitGroup
	for k := 1; k <= n; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := sh.Generate(context.Background(), &Request{}); err != nil {
				t.Error(err)
			}
		}()
		// Wait until this request is in flight before sending the next.
		for sum := int64(0); sum < int64(k); {
			sum = 0
			for _, g := range gs {
				sum += g.calls.Load()
			}
			runtime.Gosched()
		}
	}
	got := []int64{gs[0].calls.Load(), gs[1].calls.Load(), gs[2].calls.Load()}
	close(release)
	wg.Wait()
	return got
}

// statsEngine reports fixed Stats.
type statsEngine struct{ st Stats }

func (s statsEngine) Generate(context.Context, *Request) (*Result, error) { return &Result{}, nil }
func (s statsEngine) Stats() Stats                                        { return s.st }
func (s statsEngine) Close() error                                        { return nil }

// Every numeric field of Stats is summed (a field added later and not
// summed fails here).
func TestShardsStatsSumEveryField(t *testing.T) {
	var a, b Stats
	n := 1
	var fill func(v reflect.Value)
	fill = func(v reflect.Value) {
		for i := range v.NumField() {
			f := v.Field(i)
			switch f.Kind() {
			case reflect.Int, reflect.Int64:
				f.SetInt(int64(n))
			case reflect.Float64:
				f.SetFloat(float64(n))
			case reflect.Struct:
				fill(f)
				continue
			default:
				t.Fatalf("Stats field %s of kind %s: teach this test and Shards.Stats", v.Type().Field(i).Name, f.Kind())
			}
			n++
		}
	}
	fill(reflect.ValueOf(&a).Elem())
	fill(reflect.ValueOf(&b).Elem())
	got := NewShards(statsEngine{a}, statsEngine{b}).Stats()
	var check func(path string, g, x, y reflect.Value)
	check = func(path string, g, x, y reflect.Value) {
		for i := range g.NumField() {
			name := path + g.Type().Field(i).Name
			switch f := g.Field(i); f.Kind() {
			case reflect.Int, reflect.Int64:
				if f.Int() != x.Field(i).Int()+y.Field(i).Int() {
					t.Errorf("%s = %d, want %d", name, f.Int(), x.Field(i).Int()+y.Field(i).Int())
				}
			case reflect.Float64:
				if f.Float() != x.Field(i).Float()+y.Field(i).Float() {
					t.Errorf("%s = %g, want %g", name, f.Float(), x.Field(i).Float()+y.Field(i).Float())
				}
			case reflect.Struct:
				check(name+".", f, x.Field(i), y.Field(i))
			}
		}
	}
	check("", reflect.ValueOf(got), reflect.ValueOf(a), reflect.ValueOf(b))
}
