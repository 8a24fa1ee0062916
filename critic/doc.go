// Package critic scores what a reader would object to in a finished
// couplet: lines that are not parallel (Parallelism), words that do not
// belong on a 春联 (Unsuitable, UnsuitableBanner) and text that does not
// read as a Spring Festival couplet (Festive). The reranker calls it at
// serving time and `chunlian eval` reports it, so every function is
// safe for concurrent use, allocates little and loads its tables once,
// lazily, on first use (Load forces that early).
//
// Its tables are embedded: words.txt (the segmenter's dictionary),
// unsuitable.txt, banners_unsuitable.txt, festive.txt and charclass.txt.
// words.txt and festive.txt are derived by critic/internal/gen from
// ../shared and the gse module, charclass.txt by
// critic/internal/gen/classes from the training pairs (`go generate
// ./critic` runs both, in that order); the two lists are written by hand.
package critic

//go:generate go run ./internal/gen -shared ../../shared -out .
//go:generate go run ./internal/gen/classes -shared ../../shared -out charclass.txt
