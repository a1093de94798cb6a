// The demo service: GET /api/hello behind the rate limiter, GET /healthz
// outside it. Configured from the environment (see README.md):
//
//	VALKEY_ADDR=127.0.0.1:6379 PORT=8080 go run .
//	curl -i -H 'X-API-Key: demo' http://127.0.0.1:8080/api/hello
package main

import (
	"log"
	"net/http"
	"os"
	"time"
)

// newApp wires the routes: everything under /api/ is limited; /healthz and
// the like are not.
func newApp(limiter *RateLimiter) http.Handler {
	api := http.NewServeMux()
	api.HandleFunc("/api/hello", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeJSON(w, http.StatusMethodNotAllowed, map[string]interface{}{"error": "method not allowed"})
			return
		}
		writeJSON(w, http.StatusOK, map[string]interface{}{"message": "hello"})
	})
	mux := http.NewServeMux()
	mux.Handle("/api/", limiter.Middleware(api))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]interface{}{"ok": true})
	})
	return mux
}

func main() {
	cfg, err := ConfigFromEnv(os.Getenv)
	if err != nil {
		log.Fatal(err)
	}
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	limiter, err := NewRateLimiter(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer limiter.Close()
	srv := &http.Server{Addr: "127.0.0.1:" + port, Handler: newApp(limiter), ReadHeaderTimeout: 10 * time.Second}
	log.Printf("listening on http://%s, Valkey at %s, failing %s on errors", srv.Addr, cfg.ValkeyAddr, cfg.FailureMode)
	log.Fatal(srv.ListenAndServe())
}
