package bench

import (
	"fmt"
	"io"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progress shows a level while it runs. level starts the display and returns
// the function that ends it; the display reads col's atomic counters from its
// own ticker goroutine and never touches col.samples.
type progress interface {
	level(desc string, o Options, start time.Time, col *collector) (stop func())
}

func newProgress(w io.Writer, bar bool) progress {
	switch {
	case w == nil:
		return noProgress{}
	case bar:
		return barProgress{w: w}
	default:
		return lineProgress{w: w}
	}
}

type noProgress struct{}

func (noProgress) level(string, Options, time.Time, *collector) func() { return func() {} }

// counts formats the live counters.
func counts(col *collector) string {
	return fmt.Sprintf("ok=%d failed=%d 503=%d", col.done.Load(), col.failed.Load(), col.rejected.Load())
}

// ticker runs f every d on a new goroutine until the returned stop is called;
// stop waits for that goroutine, so nothing writes after it returns.
func ticker(d time.Duration, f func()) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				f()
			case <-quit:
				return
			}
		}
	}()
	return func() { close(quit); <-done }
}

// barProgress draws a schollz/progressbar per level (for terminals). The bar
// tracks time through warm-up + window; with --requests it tracks counted
// requests instead.
type barProgress struct{ w io.Writer }

func (p barProgress) level(desc string, o Options, start time.Time, col *collector) func() {
	total := int64((o.Warmup + o.Duration) / (100 * time.Millisecond))
	byCount := o.Requests > 0
	if byCount {
		total = int64(o.Requests)
	}
	bar := progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(p.w),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(200*time.Millisecond),
		progressbar.OptionShowDescriptionAtLineEnd(),
		progressbar.OptionSetRenderBlankState(true),
	)
	update := func() {
		if byCount {
			_ = bar.Set64(col.done.Load() + col.failed.Load() + col.rejected.Load())
		} else {
			_ = bar.Set64(min(total, int64(time.Since(start)/(100*time.Millisecond))))
		}
		bar.Describe(desc + " " + counts(col))
	}
	stop := ticker(250*time.Millisecond, update)
	return func() {
		stop()
		update()
		_ = bar.Finish()
		fmt.Fprintln(p.w)
	}
}

// lineProgress prints a plain line every few seconds (logs, pipes, CI).
type lineProgress struct{ w io.Writer }

func (p lineProgress) level(desc string, o Options, start time.Time, col *collector) func() {
	total := o.Warmup + o.Duration
	line := func(state string) {
		fmt.Fprintf(p.w, "bench: %s %s %.1fs/%.0fs %s\n", desc, state,
			time.Since(start).Seconds(), total.Seconds(), counts(col))
	}
	line("start")
	stop := ticker(5*time.Second, func() { line("running") })
	return func() { stop(); line("done") }
}
