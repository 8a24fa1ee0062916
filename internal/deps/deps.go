package deps

import (
	_ "github.com/chromedp/chromedp"
	_ "github.com/ebitengine/purego"
	_ "github.com/mozillazg/go-pinyin"
	_ "github.com/nlpodyssey/safetensors"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/collectors"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "github.com/schollz/progressbar/v3"
	_ "gonum.org/v1/plot"
	_ "gonum.org/v1/plot/plotter"
	_ "gonum.org/v1/plot/vg"
)
