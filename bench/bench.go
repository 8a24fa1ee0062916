// Package bench is chunlian's load tester: it drives a couplet service (ours,
// or any server with chunlian's POST /generate or the OpenAI completions API)
// with closed-loop users or open-loop Poisson arrivals, measures throughput,
// latency percentiles, TTFT and time per output token, and the server's CPU
// (and GPU, when its /metrics reports it), and writes the seed-shaped
// comparison table, a per-level table, JSON and plots.
//
// The package talks HTTP only and never imports the server, so it can measure
// any compatible endpoint. It refuses non-loopback URLs unless told otherwise,
// bounds every run in time and request count, and returns a partial report
// when its context ends (Ctrl-C).
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"strings"
	"time"
)

// Hard caps: no flag combination makes a run longer or bigger than these.
const (
	MaxLevels         = 32
	MaxConcurrency    = 4096
	MaxRate           = 100000.0 // requests/s
	MaxLevelDuration  = 10 * time.Minute
	MaxWarmup         = 2 * time.Minute
	MaxRequests       = 1_000_000 // counted requests per level
	MaxRequestTimeout = 10 * time.Minute
	MaxRun            = 4 * time.Hour
	// maxInFlightOpen bounds the goroutines of an open-loop level; arrivals
	// beyond it are counted as dropped instead of being sent.
	maxInFlightOpen = 8192
)

// Target is one service under test.
type Target struct {
	Name  string `json:"name"`  // "engine", "naive", or the user's label
	URL   string `json:"url"`   // base URL, e.g. http://127.0.0.1:8000
	API   string `json:"api"`   // APIGenerate or APIOpenAI
	Model string `json:"model"` // "model" field for OpenAI requests (may be empty)
	// PID is the server's process id when the bench spawned it: its CPU is
	// then read from /proc/PID/stat instead of /metrics.
	PID int `json:"pid,omitempty"`
}

// Options are the load and request settings shared by all targets.
type Options struct {
	Concurrency []int     `json:"concurrency,omitempty"` // closed-loop levels (users)
	Rates       []float64 `json:"rates,omitempty"`       // open-loop levels (req/s)
	// Duration is each level's measured window; with Requests > 0 it is the
	// level's time cap instead.
	Duration  time.Duration `json:"duration_ns"`
	Warmup    time.Duration `json:"warmup_ns"`          // per level, not counted
	Requests  int           `json:"requests,omitempty"` // counted requests per level; 0 = by Duration
	Modes     []string      `json:"modes"`
	Seed      uint64        `json:"seed"`
	N         int           `json:"n"`          // couplets per request
	MaxTokens int           `json:"max_tokens"` // OpenAI only; 0 = server default
	Stream    bool          `json:"stream"`
	Timeout   time.Duration `json:"timeout_ns"` // per request
	// Unseeded leaves the sampling seed out of every request (the server
	// draws one), as a page's or an SDK's requests usually do; the
	// prompts and arrivals still follow Seed.
	Unseeded bool `json:"unseeded,omitempty"`
}

// Level is one load level.
type Level struct {
	Shape       string  `json:"shape"` // "closed" or "open"
	Concurrency int     `json:"concurrency,omitempty"`
	Rate        float64 `json:"rate,omitempty"`
}

func (l Level) String() string {
	if l.Shape == "open" {
		return fmt.Sprintf("%g req/s", l.Rate)
	}
	if l.Concurrency == 1 {
		return "1 user"
	}
	return fmt.Sprintf("%d users", l.Concurrency)
}

// Levels lists the levels of o in run order: closed loop, then open loop.
func (o Options) Levels() []Level {
	var ls []Level
	for _, c := range o.Concurrency {
		ls = append(ls, Level{Shape: "closed", Concurrency: c})
	}
	for _, r := range o.Rates {
		ls = append(ls, Level{Shape: "open", Rate: r})
	}
	return ls
}

// Validate checks o against the hard caps.
func (o *Options) Validate() error {
	if len(o.Concurrency)+len(o.Rates) == 0 {
		return errors.New("no load level: give --concurrency and/or --rate")
	}
	if len(o.Concurrency)+len(o.Rates) > MaxLevels {
		return fmt.Errorf("%d levels: at most %d", len(o.Concurrency)+len(o.Rates), MaxLevels)
	}
	for _, c := range o.Concurrency {
		if c < 1 || c > MaxConcurrency {
			return fmt.Errorf("concurrency %d out of range 1..%d", c, MaxConcurrency)
		}
	}
	for _, r := range o.Rates {
		if !(r > 0) || r > MaxRate || math.IsInf(r, 0) {
			return fmt.Errorf("rate %g out of range (0, %g] req/s", r, MaxRate)
		}
	}
	if o.Duration <= 0 || o.Duration > MaxLevelDuration {
		return fmt.Errorf("duration %v out of range (0, %v]", o.Duration, MaxLevelDuration)
	}
	if o.Warmup < 0 || o.Warmup > MaxWarmup {
		return fmt.Errorf("warmup %v out of range [0, %v]", o.Warmup, MaxWarmup)
	}
	if o.Requests < 0 || o.Requests > MaxRequests {
		return fmt.Errorf("requests %d out of range [0, %d]", o.Requests, MaxRequests)
	}
	if o.Timeout <= 0 || o.Timeout > MaxRequestTimeout {
		return fmt.Errorf("timeout %v out of range (0, %v]", o.Timeout, MaxRequestTimeout)
	}
	if o.N < 1 || o.N > 64 {
		return fmt.Errorf("n %d out of range 1..64", o.N)
	}
	if o.MaxTokens < 0 || o.MaxTokens > 4096 {
		return fmt.Errorf("max-tokens %d out of range 0..4096", o.MaxTokens)
	}
	if len(o.Modes) == 0 {
		o.Modes = []string{"keyword"}
	}
	for _, m := range o.Modes {
		if !knownModes[m] {
			return fmt.Errorf("unknown mode %q", m)
		}
	}
	return nil
}

// CheckURL accepts http(s) URLs whose host is a loopback IP or "localhost";
// any other host needs allowRemote. Host names other than localhost are not
// resolved: a name's address can change between the check and the request.
func CheckURL(raw string, allowRemote bool) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("bad URL %q: %v", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("URL %q: scheme must be http or https", raw)
	}
	host := u.Hostname()
	if host == "" {
		return fmt.Errorf("URL %q has no host", raw)
	}
	if u.User != nil {
		return fmt.Errorf("URL %q: credentials in URLs are not accepted", raw)
	}
	if allowRemote {
		return nil
	}
	if strings.EqualFold(host, "localhost") {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("URL %q is not loopback; pass --allow-remote to load-test another host (only one you are allowed to)", raw)
}

// Config is one bench run.
type Config struct {
	Options
	// Targets to measure, in order (--url mode). Ignored when Spawn is set.
	Targets []Target
	// Spawn lists server variants to start one after the other: "engine"
	// (serve --engine paged) and/or "naive" (serve --engine naive).
	Spawn        []string
	ServerBin    string   // chunlian binary for Spawn (usually os.Executable())
	ServerFlags  []string // extra flags for every spawned serve
	ReadyTimeout time.Duration
	ServerLogDir string // where spawned servers' logs go ("" = os.TempDir())
	API          string // API of spawned servers (default generate)
	AllowRemote  bool
	// MaxRun bounds the whole run (0 = MaxRun cap).
	MaxRun time.Duration
	// Progress receives the progress display (nil = none); ProgressBar picks
	// the animated bar (a terminal) over plain lines.
	Progress    io.Writer
	ProgressBar bool
	// Log receives status lines (spawned servers, errors); nil = discard.
	Log     io.Writer
	Command string // the command line, recorded in the report
}

// reachTimeout bounds the connection attempt of checkReachable.
const reachTimeout = 5 * time.Second

// checkReachable opens (and closes) one TCP connection to raw's host, so
// that a dead address fails the run at once instead of producing a table
// of refused requests.
func checkReachable(ctx context.Context, raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("bad URL %q: %v", raw, err)
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	d := net.Dialer{Timeout: reachTimeout}
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(u.Hostname(), port))
	if err != nil {
		return fmt.Errorf("%s is not reachable (is the service running?): %w", raw, err)
	}
	return c.Close()
}

// Run measures every target at every level and returns the report. The
// error is for a configuration that cannot run at all; failures of single
// targets (a server that did not start) are recorded in the report, and an
// interrupted run (ctx ended, MaxRun reached) returns the partial report with
// Interrupted set.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Options.Validate(); err != nil {
		return nil, err
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	if cfg.MaxRun <= 0 || cfg.MaxRun > MaxRun {
		cfg.MaxRun = MaxRun
	}
	if cfg.API == "" {
		cfg.API = APIGenerate
	}
	if len(cfg.Spawn) == 0 && len(cfg.Targets) == 0 {
		return nil, errors.New("nothing to measure: give --url or --spawn")
	}
	for _, t := range cfg.Targets {
		if err := CheckURL(t.URL, cfg.AllowRemote); err != nil {
			return nil, err
		}
		if t.API != APIGenerate && t.API != APIOpenAI {
			return nil, fmt.Errorf("target %s: api %q (want generate or openai)", t.Name, t.API)
		}
	}
	for _, t := range cfg.Targets {
		if err := checkReachable(ctx, t.URL); err != nil {
			return nil, fmt.Errorf("target %s: %w", t.Name, err)
		}
	}
	for _, s := range cfg.Spawn {
		if _, ok := spawnEngines[s]; !ok {
			return nil, fmt.Errorf("--spawn %q: want engine and/or naive", s)
		}
	}
	if len(cfg.Spawn) > 0 && cfg.ServerBin == "" {
		return nil, errors.New("--spawn needs the chunlian binary")
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 3 * time.Minute
	}

	ctx, cancel := context.WithTimeout(ctx, cfg.MaxRun)
	defer cancel()
	rep := &Report{
		Date:    time.Now().UTC().Format(time.RFC3339),
		Machine: thisMachine(),
		Command: cfg.Command,
		Options: cfg.Options,
		Spawned: len(cfg.Spawn) > 0,
	}
	prog := newProgress(cfg.Progress, cfg.ProgressBar)

	names := cfg.Spawn
	if len(names) == 0 {
		for _, t := range cfg.Targets {
			names = append(names, t.Name)
		}
	}
	for i, name := range names {
		if ctx.Err() != nil {
			break
		}
		tr := TargetResult{Name: name}
		var t Target
		var stop func()
		if len(cfg.Spawn) > 0 {
			sp, err := spawnServer(ctx, cfg, name)
			if err != nil {
				tr.Error = err.Error()
				fmt.Fprintf(cfg.Log, "bench: %s: %v\n", name, err)
				rep.Targets = append(rep.Targets, tr)
				continue
			}
			t = Target{Name: name, URL: sp.url, API: cfg.API, PID: sp.pid}
			stop = sp.stop
			tr.Engine = spawnEngines[name]
			fmt.Fprintf(cfg.Log, "bench: %s: serving at %s (pid %d, log %s)\n", name, sp.url, sp.pid, sp.logPath)
		} else {
			t = cfg.Targets[i]
		}
		tr.URL, tr.API = t.URL, t.API
		var err error
		if tr.Levels, err = measureTarget(ctx, t, cfg.Options, prog); err != nil {
			tr.Error = err.Error()
			fmt.Fprintf(cfg.Log, "bench: %s: %v\n", name, err)
		}
		if stop != nil {
			stop()
		}
		rep.Targets = append(rep.Targets, tr)
	}
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		rep.Interrupted = "run time cap reached"
	case ctx.Err() != nil:
		rep.Interrupted = "interrupted"
	}
	return rep, nil
}

// measureTarget runs every level against t until ctx ends. The last level is
// kept (marked partial) when ctx ends during it.
func measureTarget(ctx context.Context, t Target, o Options, prog progress) ([]LevelResult, error) {
	maxConns := 1
	for _, c := range o.Concurrency {
		maxConns = max(maxConns, c)
	}
	if len(o.Rates) > 0 {
		maxConns = max(maxConns, 256)
	}
	cl := newClient(t, o, maxConns)
	defer cl.close()
	var out []LevelResult
	for i, lv := range o.Levels() {
		if ctx.Err() != nil {
			break
		}
		// Each level gets its own prompt stream so a level's requests do not
		// depend on how many the levels before it sent.
		src := newPromptSource(o.Seed+uint64(i)*0x9E3779B97F4A7C15, o.Modes)
		res := runLevel(ctx, cl, t, lv, o, src, prog)
		out = append(out, res)
		if res.unreachable {
			return out, fmt.Errorf("%s: the first %d requests of level %s were refused (%v); stopped", t.URL, refusedAbort, lv, errUnreachable)
		}
	}
	return out, nil
}
