// The recipe's HTTP behaviour against a real valkey-server with the module
// (examples/README.md, section 3). test.sh starts the server and exports
// RL_TEST_VALKEY_ADDR; each test has its own key prefix, so one server
// serves the whole run. Requests go straight to the handler (with the peer
// address in RemoteAddr); the last test serves the demo app over real TCP.
package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
)

var valkeyAddr string

// The failure tests' timeout, and the bound on every answer while Valkey
// fails: Check cuts the call at 2 * timeout; the margin is for the machine.
const (
	failureTimeout = 50 * time.Millisecond
	failureBound   = 2*failureTimeout + 150*time.Millisecond
)

func TestMain(m *testing.M) {
	valkeyAddr = os.Getenv("RL_TEST_VALKEY_ADDR")
	if valkeyAddr == "" {
		fmt.Fprintln(os.Stderr, "RL_TEST_VALKEY_ADDR is not set: run examples/go/test.sh, which starts valkey-server with the module")
		os.Exit(2)
	}
	os.Exit(m.Run())
}

// ---------------------------------------------------------------- fixtures

// newPrefix is a fresh key prefix per test.
func newPrefix() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "rl:test:" + hex.EncodeToString(b) + ":api"
}

// exists is EXISTS from a plain connection: what the tests look at in Valkey.
func exists(t *testing.T, key string) bool {
	t.Helper()
	c, err := redis.Dial("tcp", valkeyAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n, err := redis.Int(c.Do("EXISTS", key))
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// testConfig: the limits the tests start from, a slow refill (burst 5, 5 per
// 60 s: one token per 12 s), so that no token comes back however loaded the
// machine. The timeout is generous here (a loaded machine must not turn a
// slow answer into a failure); the failure tests use the real 50 ms.
func testConfig(prefix string) Config {
	c := DefaultConfig()
	c.ValkeyAddr = valkeyAddr
	c.Prefix = prefix
	c.KeyBurst, c.KeyRate, c.KeyPeriod = 5, 5, 60
	c.IPLimit, c.IPPeriod = 20, 60
	c.Timeout = time.Second
	return c
}

// client calls the demo app in process, as if from peer.
type client struct {
	t       *testing.T
	handler http.Handler
	peer    string
}

func newClient(t *testing.T, cfg Config) *client { return newClientFrom(t, cfg, "127.0.0.1") }

func newClientFrom(t *testing.T, cfg Config, peer string) *client {
	limiter, err := NewRateLimiter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { limiter.Close() })
	return &client{t: t, handler: newApp(limiter), peer: peer}
}

type answer struct {
	status int
	header http.Header
	body   map[string]interface{}
}

// get sends GET path with headers given as name, value, name, value...
func (c *client) get(path string, headers ...string) answer {
	req := httptest.NewRequest(http.MethodGet, path, nil)
	req.RemoteAddr = net.JoinHostPort(c.peer, "40000")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	c.handler.ServeHTTP(rec, req)
	var body map[string]interface{}
	_ = json.Unmarshal(rec.Body.Bytes(), &body)
	return answer{rec.Code, rec.Header(), body}
}

func (c *client) hello(apiKey string) answer { return c.get("/api/hello", "X-API-Key", apiKey) }

func (a answer) num(t *testing.T, name string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(a.header.Get(name), 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return n
}

func expectBody(t *testing.T, a answer, want map[string]interface{}) {
	t.Helper()
	if !reflect.DeepEqual(a.body, want) {
		t.Fatalf("body %v, want %v", a.body, want)
	}
}

func expectHeader(t *testing.T, h http.Header, name, want string) {
	t.Helper()
	if got := h.Get(name); got != want {
		t.Fatalf("%s: %q, want %q", name, got, want)
	}
}

func expectStatus(t *testing.T, a answer, want int) {
	t.Helper()
	if a.status != want {
		t.Fatalf("status %d, want %d (body %v)", a.status, want, a.body)
	}
}

// ---------------------------------------------------------------- limits and headers

func TestAllowsExactlyTheBurst(t *testing.T) {
	t.Parallel()
	c := newClient(t, testConfig(newPrefix()))
	var statuses []int
	for i := 0; i < 7; i++ {
		statuses = append(statuses, c.hello("key-a").status)
	}
	if want := []int{200, 200, 200, 200, 200, 429, 429}; !reflect.DeepEqual(statuses, want) {
		t.Fatalf("statuses %v, want %v", statuses, want)
	}
}

func TestHeadersOn200(t *testing.T) {
	t.Parallel()
	r := newClient(t, testConfig(newPrefix())).hello("key-a")
	expectStatus(t, r, 200)
	expectBody(t, r, map[string]interface{}{"message": "hello"})
	// burst 5 at 5 per 60 s: the GCRA's window is the 60 s it takes to earn 5 back
	expectHeader(t, r.header, "RateLimit-Policy", `"key";q=5;w=60, "ip";q=20;w=60`)
	// the key (4 left) is more restrictive than the IP (19 left); one token takes 12 s
	expectHeader(t, r.header, "RateLimit", `"key";r=4;t=12`)
	expectHeader(t, r.header, "X-RateLimit-Limit", "5")
	expectHeader(t, r.header, "X-RateLimit-Remaining", "4")
	expectHeader(t, r.header, "X-RateLimit-Reset", "12")
	expectHeader(t, r.header, "Retry-After", "")
}

func TestHeadersOn429(t *testing.T) {
	t.Parallel()
	c := newClient(t, testConfig(newPrefix()))
	start := time.Now()
	for i := 0; i < 5; i++ {
		expectStatus(t, c.hello("key-a"), 200)
	}
	r := c.hello("key-a")
	slack := int64(math.Ceil(time.Since(start).Seconds())) // the server's clock moved at most this much
	expectStatus(t, r, 429)
	expectHeader(t, r.header, "Content-Type", "application/json")
	retry := r.num(t, "Retry-After")
	if retry < 12-slack || retry > 12 { // the next token: 12 s after the first request
		t.Fatalf("Retry-After %d, slack %d", retry, slack)
	}
	expectBody(t, r, map[string]interface{}{"error": "rate limited", "retry_after": float64(retry)})
	expectHeader(t, r.header, "RateLimit-Policy", `"key";q=5;w=60, "ip";q=20;w=60`)
	rl := r.header.Get("RateLimit")
	if !strings.HasPrefix(rl, `"key";r=0;t=`) {
		t.Fatalf("RateLimit %q", rl)
	}
	reset, _ := strconv.ParseInt(strings.TrimPrefix(rl, `"key";r=0;t=`), 10, 64)
	if reset < 60-slack || reset > 60 { // all 5 back 60 s after the first
		t.Fatalf("t=%d, slack %d", reset, slack)
	}
	expectHeader(t, r.header, "X-RateLimit-Limit", "5")
	expectHeader(t, r.header, "X-RateLimit-Remaining", "0")
	expectHeader(t, r.header, "X-RateLimit-Reset", strconv.FormatInt(reset, 10))
}

func TestIPLimitIsSharedAcrossKeys(t *testing.T) {
	t.Parallel()
	p := newPrefix()
	cfg := testConfig(p)
	cfg.IPLimit = 3
	c := newClient(t, cfg)
	for i := 0; i < 3; i++ {
		expectStatus(t, c.hello(fmt.Sprintf("k%d", i)), 200)
	}
	r := c.hello("k3")
	expectStatus(t, r, 429)
	if rl := r.header.Get("RateLimit"); !strings.HasPrefix(rl, `"ip";r=0;t=`) {
		t.Fatalf("RateLimit %q", rl)
	}
	expectHeader(t, r.header, "X-RateLimit-Limit", "3")
	expectHeader(t, r.header, "RateLimit-Policy", `"key";q=5;w=60, "ip";q=3;w=60`)
	// All or nothing: the IP denied it, so the key's limiter was not charged.
	if exists(t, p+":key:k3") {
		t.Fatal("the key's limiter was charged")
	}
}

func TestRecoversAfterRetryAfter(t *testing.T) {
	t.Parallel()
	cfg := testConfig(newPrefix())
	cfg.KeyBurst, cfg.KeyRate, cfg.KeyPeriod = 2, 2, 1 // one token every 500 ms
	c := newClient(t, cfg)
	// On a loaded machine a token may come back meanwhile: go on until denied.
	r := c.hello("key-a")
	for i := 0; i < 20 && r.status != 429; i++ {
		r = c.hello("key-a")
	}
	expectStatus(t, r, 429)
	retry := r.num(t, "Retry-After")
	if retry != 1 { // 500 ms at most, rounded up
		t.Fatalf("Retry-After %d", retry)
	}
	time.Sleep(time.Duration(retry) * time.Second)
	expectStatus(t, c.hello("key-a"), 200)
}

func TestAPIKeysAreLimitedSeparately(t *testing.T) {
	t.Parallel()
	c := newClient(t, testConfig(newPrefix()))
	for i := 0; i < 5; i++ {
		expectStatus(t, c.hello("key-a"), 200)
	}
	expectStatus(t, c.hello("key-a"), 429)
	r := c.hello("key-b")
	expectStatus(t, r, 200)
	expectHeader(t, r.header, "X-RateLimit-Remaining", "4")
}

func TestAPIKeyLongerThan256BytesIs401(t *testing.T) {
	t.Parallel()
	p := newPrefix()
	c := newClient(t, testConfig(p))
	long := strings.Repeat("k", 256)
	expectStatus(t, c.hello(long), 200)
	r := c.hello(long + "k")
	expectStatus(t, r, 401)
	expectBody(t, r, map[string]interface{}{"error": "API key too long"})
	expectHeader(t, r.header, "RateLimit", "")
	if !exists(t, p+":key:"+long) || exists(t, p+":key:"+long+"k") {
		t.Fatal("the wrong keys were charged")
	}
}

func TestRepeatedAPIKeyHeaderUsesTheFirst(t *testing.T) {
	t.Parallel()
	p := newPrefix()
	c := newClient(t, testConfig(p))
	expectStatus(t, c.get("/api/hello", "X-API-Key", "k1", "X-API-Key", "k2"), 200)
	if !exists(t, p+":key:k1") || exists(t, p+":key:k1,k2") || exists(t, p+":key:k1, k2") {
		t.Fatal("not limited as the first key")
	}
}

func TestMissingAPIKeyIs401(t *testing.T) {
	t.Parallel()
	c := newClient(t, testConfig(newPrefix()))
	for _, headers := range [][]string{nil, {"X-API-Key", ""}} {
		r := c.get("/api/hello", headers...)
		expectStatus(t, r, 401)
		expectBody(t, r, map[string]interface{}{"error": "missing API key"})
		expectHeader(t, r.header, "RateLimit", "")
	}
}

// ---------------------------------------------------------------- client IP

func TestForwardedForFromUntrustedPeerIsIgnored(t *testing.T) {
	t.Parallel()
	p := newPrefix()
	cfg := testConfig(p)
	cfg.IPLimit = 2 // no trusted proxies: 127.0.0.1 is a client like any other
	c := newClient(t, cfg)
	var r answer
	for i, forged := range []string{"198.51.100.1", "198.51.100.2", "198.51.100.3"} {
		r = c.get("/api/hello", "X-API-Key", fmt.Sprintf("k%d", i), "X-Forwarded-For", forged)
	}
	expectStatus(t, r, 429) // the three share the peer's IP limit
	if !exists(t, p+":ip:127.0.0.1") || exists(t, p+":ip:198.51.100.1") {
		t.Fatal("X-Forwarded-For from an untrusted peer was used")
	}
}

func TestForwardedForFromTrustedPeerIsUsed(t *testing.T) {
	t.Parallel()
	p := newPrefix()
	cfg := testConfig(p)
	cfg.IPLimit = 2
	var err error
	if cfg.TrustedProxies, err = ParseTrustedProxies("10.0.0.0/8"); err != nil {
		t.Fatal(err)
	}
	c := newClientFrom(t, cfg, "10.0.0.5")
	// The client wrote the left entry itself; our proxy appended the address it saw.
	chain := []string{"X-API-Key", "k1", "X-Forwarded-For", "198.51.100.9, 203.0.113.7"}
	expectStatus(t, c.get("/api/hello", chain...), 200)
	expectStatus(t, c.get("/api/hello", chain...), 200)
	expectStatus(t, c.get("/api/hello", chain...), 429)
	expectStatus(t, c.get("/api/hello", "X-API-Key", "k1", "X-Forwarded-For", "203.0.113.8"), 200)
	if !exists(t, p+":ip:203.0.113.7") || exists(t, p+":ip:198.51.100.9") || exists(t, p+":ip:10.0.0.5") {
		t.Fatal("the wrong address was limited")
	}
}

func TestClientIPRules(t *testing.T) {
	t.Parallel()
	trusted, err := ParseTrustedProxies("10.0.0.0/8, ::1")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		peer string
		xff  []string
		want string
	}{
		{"192.0.2.1:1", []string{"203.0.113.7"}, "192.0.2.1"},                            // untrusted peer
		{"10.1.1.1:1", nil, "10.1.1.1"},                                                  // trusted, no header
		{"10.1.1.1:1", []string{"203.0.113.7, 10.2.2.2"}, "203.0.113.7"},                 // skips our proxies
		{"10.1.1.1:1", []string{"10.3.3.3, 10.2.2.2"}, "10.3.3.3"},                       // all trusted: leftmost
		{"10.1.1.1:1", []string{"203.0.113.7, junk"}, "10.1.1.1"},                        // garbage stops the walk
		{"[::ffff:192.0.2.1]:1", nil, "192.0.2.1"},                                       // IPv4-mapped
		{"[::1]:1", []string{"2001:DB8:0:0::1"}, "2001:db8::1"},                          // canonical IPv6
		{"10.1.1.1:1", []string{"198.51.100.9", "203.0.113.7, 10.2.2.2"}, "203.0.113.7"}, // lines form one list
		{"@", nil, "unknown"}, // not an IP peer (a Unix socket)
	} {
		if got := ClientIP(tc.peer, tc.xff, trusted); got != tc.want {
			t.Errorf("ClientIP(%q, %q) = %q, want %q", tc.peer, tc.xff, got, tc.want)
		}
	}
	if _, err := ParseTrustedProxies("10.0.0.0/33"); err == nil {
		t.Error("10.0.0.0/33 accepted")
	}
	if _, err := ParseTrustedProxies("nope"); err == nil {
		t.Error("nope accepted")
	}
}

// ---------------------------------------------------------------- header values of made-up replies (no server)

// denied is a 429 decided by the key's limiter (0 left), the IP's with room.
func denied(retryAfterMs, resetAfterMs int64) Decision {
	return Decision{Allowed: false, RetryAfterMs: retryAfterMs, Limiters: []Limiter{
		{"key", false, 5, 0, retryAfterMs, resetAfterMs}, {"ip", true, 20, 10, 0, 30000}}}
}

func headersOf(t *testing.T, d Decision) http.Header {
	t.Helper()
	rl, err := NewRateLimiter(testConfig("unused")) // does not connect
	if err != nil {
		t.Fatal(err)
	}
	defer rl.Close()
	h := http.Header{}
	rl.setHeaders(h, d)
	return h
}

func TestRetryAfterIsRoundedUp(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ms   int64
		want string
	}{{1, "1"}, {999, "1"}, {1000, "1"}, {1001, "2"}, {11950, "12"}} {
		expectHeader(t, headersOf(t, denied(tc.ms, 60000)), "Retry-After", tc.want)
		if s, ok := denied(tc.ms, 60000).RetryAfterSeconds(); !ok || strconv.FormatInt(s, 10) != tc.want {
			t.Fatalf("%d ms: the 429 body's retry_after %d, want %s", tc.ms, s, tc.want)
		}
	}
}

func TestResetIsRoundedUp(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ms   int64
		want string
	}{{0, "0"}, {1, "1"}, {1000, "1"}, {59001, "60"}} {
		h := headersOf(t, denied(1000, tc.ms))
		expectHeader(t, h, "RateLimit", `"key";r=0;t=`+tc.want)
		expectHeader(t, h, "X-RateLimit-Reset", tc.want)
	}
}

func TestHeadersOfADecision(t *testing.T) {
	t.Parallel()
	ok := Decision{Allowed: true, Limiters: []Limiter{{"key", true, 5, 3, 0, 24000}, {"ip", true, 20, 3, 0, 59001}}}
	h := headersOf(t, ok)
	// A tie on remaining and wait: the longer reset, the IP's, is reported.
	expectHeader(t, h, "RateLimit-Policy", `"key";q=5;w=60, "ip";q=20;w=60`)
	expectHeader(t, h, "RateLimit", `"ip";r=3;t=60`)
	expectHeader(t, h, "X-RateLimit-Limit", "20")
	expectHeader(t, h, "X-RateLimit-Remaining", "3")
	expectHeader(t, h, "X-RateLimit-Reset", "60")
	expectHeader(t, h, "Retry-After", "")
	never := Decision{Allowed: false, RetryAfterMs: -1, Limiters: []Limiter{{"key", false, 5, 0, 5000, 60000}, {"ip", false, 20, 0, -1, 0}}}
	h = headersOf(t, never)
	expectHeader(t, h, "RateLimit", `"ip";r=0;t=0`) // -1 (never) is the longest wait
	expectHeader(t, h, "Retry-After", "")
}

func TestEmptyEnvironmentVariablesAreUnset(t *testing.T) {
	t.Parallel()
	for _, blank := range []string{"", "  "} {
		cfg, err := ConfigFromEnv(func(string) string { return blank })
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(cfg, DefaultConfig()) {
			t.Fatalf("%q everywhere: %+v, want the defaults", blank, cfg)
		}
	}
}

// ---------------------------------------------------------------- failure policy

// timedHello is a request that must be answered within failureBound.
func (c *client) timedHello() answer {
	c.t.Helper()
	start := time.Now()
	r := c.hello("key-a")
	if took := time.Since(start); took >= failureBound {
		c.t.Fatalf("answered in %v, bound %v", took, failureBound)
	}
	return r
}

// proxy is a TCP proxy in front of the real Valkey, to play one that
// stalls. New connections are forwarded to the real server (mode "forward")
// or accepted and never answered ("hang"); blackhole makes every connection
// open so far stop forwarding, both ways, without closing it (a Valkey gone
// behind a dead route, or a connection a failover left behind); closeAll
// closes them (Valkey's `timeout` closing idle clients, a NAT forgetting).
type proxy struct {
	l     net.Listener
	mu    sync.Mutex
	mode  string
	conns []*proxyConn
}

type proxyConn struct {
	socks []net.Conn
	dead  atomic.Bool
}

func newProxy(t *testing.T, mode string) *proxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l, mode: mode}
	t.Cleanup(p.closeAll)
	go func() {
		for {
			client, err := l.Accept()
			if err != nil {
				return
			}
			pc := &proxyConn{socks: []net.Conn{client}}
			p.mu.Lock()
			if p.mode == "forward" {
				if upstream, err := net.Dial("tcp", valkeyAddr); err == nil {
					pc.socks = append(pc.socks, upstream)
					go pc.pump(client, upstream)
					go pc.pump(upstream, client)
				}
			}
			p.conns = append(p.conns, pc)
			p.mu.Unlock()
		}
	}()
	return p
}

func (pc *proxyConn) pump(src, dst net.Conn) {
	buf := make([]byte, 65536)
	for {
		n, err := src.Read(buf)
		if n > 0 && !pc.dead.Load() { // else swallowed: black-holed
			_, _ = dst.Write(buf[:n])
		}
		if err != nil {
			return
		}
	}
}

func (p *proxy) addr() string { return p.l.Addr().String() }

func (p *proxy) setMode(mode string) { p.mu.Lock(); p.mode = mode; p.mu.Unlock() }

func (p *proxy) blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pc := range p.conns {
		pc.dead.Store(true)
	}
}

func (p *proxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pc := range p.conns {
		for _, s := range pc.socks {
			s.Close()
		}
	}
	p.conns = nil
}

// TestStalledConnectionIsReplaced: a Valkey that accepts and never answers,
// then answers (a new connection reaches it); then the connection in use
// goes dead without being closed. Each time, after a failure within the
// bound, a later request is decided.
func TestStalledConnectionIsReplaced(t *testing.T) {
	t.Parallel()
	p := newProxy(t, "hang")
	defer p.l.Close()
	cfg := testConfig(newPrefix())
	cfg.ValkeyAddr, cfg.Timeout = p.addr(), failureTimeout // fails open
	c := newClient(t, cfg)
	untilDecided := func() {
		deadline := time.Now().Add(3 * time.Second)
		for c.timedHello().header.Get("RateLimit") == "" {
			if time.Now().After(deadline) {
				t.Fatal("no decision 3 s after Valkey came back")
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if r := c.timedHello(); r.status != 200 || r.header.Get("RateLimit") != "" {
		t.Fatalf("hung: %d, RateLimit %q", r.status, r.header.Get("RateLimit"))
	}
	p.setMode("forward")
	untilDecided()
	p.blackhole()
	if r := c.timedHello(); r.status != 200 || r.header.Get("RateLimit") != "" {
		t.Fatalf("black-holed: %d, RateLimit %q", r.status, r.header.Get("RateLimit"))
	}
	untilDecided()
}

// TestIdleConnectionIsPingedBeforeUse: a pooled connection the other end
// closed while it was idle is found out by TestOnBorrow's PING, and the
// request is decided on a new one (not failed on the dead one).
func TestIdleConnectionIsPingedBeforeUse(t *testing.T) {
	t.Parallel()
	p := newProxy(t, "forward")
	defer p.l.Close()
	cfg := testConfig(newPrefix())
	cfg.ValkeyAddr = p.addr()
	limiter, err := NewRateLimiter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer limiter.Close()
	if limiter.pingIdle != 30*time.Second {
		t.Fatalf("pingIdle %v", limiter.pingIdle)
	}
	limiter.pingIdle = 0 // every idle connection counts as long idle
	c := &client{t: t, handler: newApp(limiter), peer: "127.0.0.1"}
	expectHeader(t, c.hello("key-a").header, "X-RateLimit-Remaining", "4")
	p.closeAll()
	time.Sleep(50 * time.Millisecond) // let the close reach the pooled connection
	expectHeader(t, c.hello("key-a").header, "X-RateLimit-Remaining", "3")
}

func TestFailurePolicy(t *testing.T) {
	t.Parallel()
	// A loopback port nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	// A port that accepts connections (the kernel completes the handshake)
	// and never answers: a Valkey that hangs.
	hung, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hung.Close()

	for _, target := range []struct{ name, addr string }{{"dead", dead}, {"hung", hung.Addr().String()}} {
		for _, mode := range []FailureMode{FailOpen, FailClosed} {
			cfg := testConfig(newPrefix())
			cfg.ValkeyAddr, cfg.FailureMode, cfg.Timeout = target.addr, mode, failureTimeout
			c := newClient(t, cfg)
			// The second request shows that a failed connection is not left hanging.
			for attempt := 1; attempt <= 2; attempt++ {
				what := fmt.Sprintf("%s %s #%d", target.name, mode, attempt)
				start := time.Now()
				r := c.hello("key-a")
				if took := time.Since(start); took >= failureBound {
					t.Fatalf("%s: answered in %v, bound %v", what, took, failureBound)
				}
				if r.header.Get("RateLimit") != "" || r.header.Get("X-RateLimit-Remaining") != "" {
					t.Fatalf("%s: rate headers on a failure", what)
				}
				if mode == FailOpen {
					expectStatus(t, r, 200)
					expectBody(t, r, map[string]interface{}{"message": "hello"})
				} else {
					expectStatus(t, r, 503)
					expectHeader(t, r.header, "Retry-After", "1")
					expectBody(t, r, map[string]interface{}{"error": "rate limiter unavailable"})
				}
			}
		}
	}
}

// ---------------------------------------------------------------- the demo app

// TestDemoAppFromEnvironment: the demo as deployed, configured from the
// environment, over real HTTP (so the peer address is the socket's).
func TestDemoAppFromEnvironment(t *testing.T) {
	t.Parallel()
	p := newPrefix()
	env := map[string]string{"VALKEY_ADDR": valkeyAddr, "RL_PREFIX": p,
		"RL_KEY_BURST": "3", "RL_KEY_RATE": "3", "RL_KEY_PERIOD": "60"}
	cfg, err := ConfigFromEnv(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	cfg.Timeout = time.Second // a loaded machine must not make this test fail open
	limiter, err := NewRateLimiter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer limiter.Close()
	srv := httptest.NewServer(newApp(limiter))
	defer srv.Close()

	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/api/hello", nil)
	req.Header.Set("X-API-Key", "key-a")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	expectHeader(t, res.Header, "RateLimit", `"key";r=2;t=20`)
	expectHeader(t, res.Header, "RateLimit-Policy", `"key";q=3;w=60, "ip";q=20;w=60`)
	if !exists(t, p+":ip:127.0.0.1") { // the real peer address
		t.Fatal("the peer's address was not limited")
	}
	health, err := http.Get(srv.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	health.Body.Close()
	if health.StatusCode != 200 || health.Header.Get("RateLimit") != "" { // not limited
		t.Fatalf("/healthz: %d, RateLimit %q", health.StatusCode, health.Header.Get("RateLimit"))
	}

	if _, err := ConfigFromEnv(func(k string) string { return map[string]string{"RL_FAILURE_MODE": "maybe"}[k] }); err == nil {
		t.Fatal("RL_FAILURE_MODE=maybe accepted")
	}
	zeroRate := DefaultConfig()
	zeroRate.KeyRate = 0
	if _, err := NewRateLimiter(zeroRate); err == nil || err.Error() != "KeyRate must be at least 1" {
		t.Fatalf("KeyRate 0: %v", err)
	}
}
