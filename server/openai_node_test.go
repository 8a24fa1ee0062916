package server

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// openaiNPMVersion is the official client the conformance check runs (a
// fixed version, so a client release cannot change the test's meaning).
const openaiNPMVersion = "6.30.1"

// TestOpenAINodeClient runs testdata/openai_conformance.mjs with the
// official `openai` npm package against the real stack on the random test
// model: models list/retrieve, completions, chat (natural language),
// streaming (with token chunks), and error cases with their OpenAI error
// classes, codes and params. It skips when node or npm is missing, or when
// npm cannot install the package (no registry).
func TestOpenAINodeClient(t *testing.T) {
	if testing.Short() {
		t.Skip("npm client test skipped in -short mode")
	}
	node, errN := exec.LookPath("node")
	npm, errP := exec.LookPath("npm")
	if errN != nil || errP != nil {
		t.Skip("node or npm not found in PATH; skipping the official openai client check (apt-get install nodejs npm)")
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	install := exec.CommandContext(ctx, npm, "install", "--no-audit", "--no-fund", "--silent", "--prefix", dir, "openai@"+openaiNPMVersion)
	if out, err := install.CombinedOutput(); err != nil {
		t.Skipf("npm install openai@%s failed (no registry?): %v\n%s", openaiNPMVersion, err, out)
	}
	script, err := os.ReadFile(filepath.Join("testdata", "openai_conformance.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	// The script must sit next to node_modules for `import "openai"`.
	path := filepath.Join(dir, "conformance.mjs")
	if err := os.WriteFile(path, script, 0o644); err != nil {
		t.Fatal(err)
	}
	rs := newRealStack(t, stackOpts{cfg: Config{APIKey: "conformance-key"}})
	cmd := exec.CommandContext(ctx, node, path)
	cmd.Env = append(os.Environ(), "BASE_URL="+rs.base, "API_KEY=conformance-key", "MODEL=chunlian-test")
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("the openai npm client check failed: %v", err)
	}
}
