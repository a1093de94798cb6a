// Rate limiting for net/http with the valkey-ratelimit module's RL.ALL.
//
// Copy this file into your service (change the package line). It needs
// redigo (github.com/gomodule/redigo) and the standard library only:
//
//	limiter, err := NewRateLimiter(config) // does not connect yet
//	...
//	defer limiter.Close()
//	mux.Handle("/api/", limiter.Middleware(apiHandler))
//
// Every request through the middleware is charged to two limiters in one
// atomic call: its API key (a GCRA: bursts of KeyBurst, KeyRate per
// KeyPeriod) and its client IP (a sliding window: IPLimit per IPPeriod). The
// contract (headers, status codes, failure policy) is examples/README.md's,
// the same in every recipe.
//
// Written for Go 1.19 and later (Debian 12's golang-go is 1.19).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gomodule/redigo/redis"
)

// FailureMode says what to do when Valkey cannot decide (down, slow, an
// error reply).
type FailureMode string

const (
	// FailOpen serves the request, without rate-limit headers, and logs a
	// warning: an outage of the limiter does not become an outage of the API.
	FailOpen FailureMode = "open"
	// FailClosed answers 503 with Retry-After: 1: for endpoints where
	// unlimited traffic is worse than none (logins, payments, expensive calls).
	FailClosed FailureMode = "closed"
)

// Config holds the knobs; DefaultConfig has the defaults every recipe shares.
type Config struct {
	ValkeyAddr string // host:port
	Prefix     string // key prefix: bump the version (rl:v2:api) to start from fresh limiters

	KeyBurst  int64 // per API key, GCRA: KeyBurst at once ...
	KeyRate   int64 // ... then KeyRate per KeyPeriod seconds
	KeyPeriod int64
	IPLimit   int64 // per client IP, sliding window: IPLimit per IPPeriod seconds
	IPPeriod  int64

	TrustedProxies []netip.Prefix // peers whose X-Forwarded-For is believed: your proxies
	FailureMode    FailureMode
	Timeout        time.Duration // connect timeout and command timeout; a whole call is cut at 2 * Timeout
}

// MaxAPIKeyBytes: longer API keys are refused (401) before any Valkey call,
// so that one request cannot create a huge key.
const MaxAPIKeyBytes = 256

// pingIdleAfter: a pooled connection idle for longer is PINGed before use
// (Valkey's `timeout`, a NAT or a firewall may have dropped it meanwhile).
const pingIdleAfter = 30 * time.Second

// DefaultConfig: bursts of 5 and 5 per second per key, 20 per minute per IP,
// fail open, 50 ms timeouts.
func DefaultConfig() Config {
	return Config{
		ValkeyAddr: "127.0.0.1:6379",
		Prefix:     "rl:v1:api",
		KeyBurst:   5, KeyRate: 5, KeyPeriod: 1,
		IPLimit: 20, IPPeriod: 60,
		FailureMode: FailOpen,
		Timeout:     50 * time.Millisecond,
	}
}

// ConfigFromEnv reads VALKEY_ADDR, RL_PREFIX, RL_KEY_BURST, RL_KEY_RATE,
// RL_KEY_PERIOD, RL_IP_LIMIT, RL_IP_PERIOD, RL_TRUSTED_PROXIES
// (comma-separated IPs/CIDRs), RL_FAILURE_MODE (open/closed) and
// RL_TIMEOUT_MS through getenv (os.Getenv); unset, empty or blank ones keep
// their default.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	c := DefaultConfig()
	str := func(name string, dst *string) {
		if v := strings.TrimSpace(getenv(name)); v != "" {
			*dst = v
		}
	}
	num := func(name string, dst *int64) error {
		v := strings.TrimSpace(getenv(name))
		if v == "" {
			return nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			return fmt.Errorf("%s must be an integer of at least 1, not %q", name, v)
		}
		*dst = n
		return nil
	}
	str("VALKEY_ADDR", &c.ValkeyAddr)
	str("RL_PREFIX", &c.Prefix)
	timeoutMs := int64(c.Timeout / time.Millisecond)
	for _, n := range []struct {
		name string
		dst  *int64
	}{
		{"RL_KEY_BURST", &c.KeyBurst}, {"RL_KEY_RATE", &c.KeyRate}, {"RL_KEY_PERIOD", &c.KeyPeriod},
		{"RL_IP_LIMIT", &c.IPLimit}, {"RL_IP_PERIOD", &c.IPPeriod}, {"RL_TIMEOUT_MS", &timeoutMs},
	} {
		if err := num(n.name, n.dst); err != nil {
			return c, err
		}
	}
	c.Timeout = time.Duration(timeoutMs) * time.Millisecond
	switch mode := FailureMode(strings.TrimSpace(getenv("RL_FAILURE_MODE"))); mode {
	case "":
	case FailOpen, FailClosed:
		c.FailureMode = mode
	default:
		return c, fmt.Errorf("RL_FAILURE_MODE must be open or closed, not %q", mode)
	}
	proxies, err := ParseTrustedProxies(getenv("RL_TRUSTED_PROXIES"))
	if err != nil {
		return c, err
	}
	c.TrustedProxies = proxies
	return c, nil
}

// Validate checks that every count and period is at least 1 and that there
// is a timeout.
func (c Config) Validate() error {
	for _, n := range []struct {
		name string
		v    int64
	}{{"KeyBurst", c.KeyBurst}, {"KeyRate", c.KeyRate}, {"KeyPeriod", c.KeyPeriod}, {"IPLimit", c.IPLimit}, {"IPPeriod", c.IPPeriod}} {
		if n.v < 1 {
			return fmt.Errorf("%s must be at least 1", n.name)
		}
	}
	if c.Timeout <= 0 {
		return fmt.Errorf("Timeout must be positive")
	}
	return nil
}

// ParseTrustedProxies parses "10.0.0.0/8, 192.0.2.7, ::1": CIDRs or single IPs.
func ParseTrustedProxies(list string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, entry := range strings.Split(list, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		if strings.Contains(entry, "/") {
			p, err := netip.ParsePrefix(entry)
			if err != nil {
				return nil, fmt.Errorf("trusted proxy %q: %v", entry, err)
			}
			if p.Addr().Is4In6() && p.Bits() >= 96 { // ::ffff:10.0.0.0/104 is 10.0.0.0/8
				p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
			}
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(entry)
		if err != nil {
			return nil, fmt.Errorf("trusted proxy %q: %v", entry, err)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// ---------------------------------------------------------------- client IP

// ClientIP returns the address to limit: the peer's (remoteAddr, "ip:port"
// as in http.Request.RemoteAddr), unless the peer is a trusted proxy.
//
// Anyone can send X-Forwarded-For, so it is read only when the direct peer
// is one of our proxies, and then from the right: each proxy appends the
// address it saw, so the rightmost entries are our proxies' and the first
// address that is not one of them is the client. What stands left of it was
// written by the client itself and proves nothing. A malformed entry stops
// the walk at the last hop we could vouch for; when every entry is a trusted
// proxy, the leftmost is used. forwardedFor holds the header's lines (a
// header may arrive split over several: they form one list).
func ClientIP(remoteAddr string, forwardedFor []string, trusted []netip.Prefix) string {
	host := remoteAddr
	if h, _, err := net.SplitHostPort(remoteAddr); err == nil {
		host = h
	}
	ip, ok := parseIP(host)
	if !ok {
		return "unknown" // e.g. a Unix socket: all such requests share one IP limit
	}
	if !isTrusted(ip, trusted) || len(forwardedFor) == 0 {
		return ip.String()
	}
	entries := strings.Split(strings.Join(forwardedFor, ","), ",")
	for i := len(entries) - 1; i >= 0; i-- {
		hop, ok := parseIP(entries[i])
		if !ok {
			break // garbage: stop at the last hop we could vouch for
		}
		ip = hop
		if !isTrusted(hop, trusted) {
			break
		}
	}
	return ip.String()
}

// parseIP parses an address and normalises it: IPv4-mapped IPv6
// (::ffff:192.0.2.1) is the IPv4 address, IPv6 in canonical form, no zone.
func parseIP(s string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(strings.TrimSpace(s))
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap().WithZone(""), true
}

func isTrusted(ip netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// ---------------------------------------------------------------- the decision

// Limiter is one limiter's five fields from the RL.ALL reply.
type Limiter struct {
	Name         string // "key" or "ip": the item's name in the RateLimit header
	Allowed      bool
	Limit        int64
	Remaining    int64
	RetryAfterMs int64
	ResetAfterMs int64
}

// Decision is the result of one RL.ALL call.
type Decision struct {
	Allowed      bool
	RetryAfterMs int64     // the call's wait: the longest of the limiters' (0 when allowed; -1 never)
	Limiters     []Limiter // the API key's, then the IP's
}

// Binding is the most restrictive limiter, which RateLimit and X-RateLimit-*
// describe: the least remaining, then the longest wait (-1, "never", counts
// as the longest), then the longest reset, then the first.
func (d Decision) Binding() Limiter {
	wait := func(ms int64) int64 {
		if ms < 0 {
			return 1<<63 - 1
		}
		return ms
	}
	best := d.Limiters[0]
	for _, l := range d.Limiters[1:] {
		switch {
		case l.Remaining != best.Remaining:
			if l.Remaining < best.Remaining {
				best = l
			}
		case wait(l.RetryAfterMs) != wait(best.RetryAfterMs):
			if wait(l.RetryAfterMs) > wait(best.RetryAfterMs) {
				best = l
			}
		case l.ResetAfterMs > best.ResetAfterMs:
			best = l
		}
	}
	return best
}

// RetryAfterSeconds is Retry-After: whole seconds, rounded up, at least 1;
// false when the request can never pass (RetryAfterMs = -1).
func (d Decision) RetryAfterSeconds() (int64, bool) {
	if d.RetryAfterMs < 0 {
		return 0, false
	}
	if s := ceilSeconds(d.RetryAfterMs); s > 1 {
		return s, true
	}
	return 1, true
}

// ceilSeconds: milliseconds to whole seconds, rounded up: a client that
// waits that long is never early.
func ceilSeconds(ms int64) int64 {
	if ms <= 0 {
		return 0
	}
	return (ms + 999) / 1000
}

// ---------------------------------------------------------------- the limiter

// RateLimiter is the Valkey side and the middleware. Safe for concurrent use.
type RateLimiter struct {
	cfg    Config
	pool   *redis.Pool
	policy string

	mu       sync.Mutex // guards the warning throttle
	lastWarn time.Time
	failures int

	pingIdle time.Duration // pingIdleAfter (the tests lower it)
}

// NewRateLimiter does not connect: the pool dials on first use, so the
// service starts (and applies its failure policy) while Valkey is down.
func NewRateLimiter(cfg Config) (*RateLimiter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// For the GCRA q is the burst and w the time to earn a whole burst back,
	// ceil(burst * period / rate) seconds; for the sliding window the limit
	// and its period. One item per limiter, in call order.
	keyWindow := (cfg.KeyBurst*cfg.KeyPeriod + cfg.KeyRate - 1) / cfg.KeyRate
	policy := fmt.Sprintf(`"key";q=%d;w=%d, "ip";q=%d;w=%d`, cfg.KeyBurst, keyWindow, cfg.IPLimit, cfg.IPPeriod)
	rl := &RateLimiter{cfg: cfg, policy: policy, pingIdle: pingIdleAfter}
	t := cfg.Timeout
	rl.pool = &redis.Pool{
		// A client that gives up quickly: a limiter must never be the slow
		// part of a request. Connect, read and write each time out after t,
		// and Check cuts the whole call at 2t; redigo never retries, and a
		// connection that failed or timed out is discarded (the next request
		// dials anew). Nothing is queued for later.
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			return redis.DialContext(ctx, "tcp", cfg.ValkeyAddr,
				redis.DialConnectTimeout(t), redis.DialReadTimeout(t), redis.DialWriteTimeout(t))
		},
		// A connection idle for a while may have been closed by the other
		// end: PING it first (a failed PING discards it and dials anew).
		TestOnBorrow: func(c redis.Conn, idleSince time.Time) error {
			if time.Since(idleSince) < rl.pingIdle {
				return nil
			}
			_, err := c.Do("PING")
			return err
		},
		MaxIdle:     64, // connections kept open between bursts
		IdleTimeout: 4 * time.Minute,
	}
	return rl, nil
}

// Config returns the limiter's configuration.
func (rl *RateLimiter) Config() Config { return rl.cfg }

// Close closes the pooled connections.
func (rl *RateLimiter) Close() error { return rl.pool.Close() }

// Check charges one request by apiKey from ip to both limiters, atomically.
// Any error (connection, timeout, error reply, unexpected reply) means no
// decision: the caller applies the failure policy. It returns within
// 2 * Timeout, whatever Valkey does.
func (rl *RateLimiter) Check(ctx context.Context, apiKey, ip string) (Decision, error) {
	// One deadline for the whole call: getting a connection (a dial, or the
	// PING of one long idle) and RL.ALL. Each step also has its own timeout,
	// so a call given up here ends soon after in the background, and its
	// connection is discarded if it timed out.
	limit := 2 * rl.cfg.Timeout
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	type result struct {
		d   Decision
		err error
	}
	done := make(chan result, 1) // buffered: a call given up never blocks
	go func() {
		d, err := rl.call(ctx, apiKey, ip)
		done <- result{d, err}
	}()
	select {
	case r := <-done:
		return r.d, r.err
	case <-ctx.Done():
		return Decision{}, fmt.Errorf("no answer from Valkey within %v: %w", limit, ctx.Err())
	}
}

func (rl *RateLimiter) call(ctx context.Context, apiKey, ip string) (Decision, error) {
	c := rl.cfg
	conn, err := rl.pool.GetContext(ctx) // the dial is bounded by its own timeout and ctx
	if err != nil {
		return Decision{}, err
	}
	defer conn.Close() // back to the pool, or discarded if it failed
	deadline, _ := ctx.Deadline()
	left := time.Until(deadline)
	if left <= 0 {
		return Decision{}, context.DeadlineExceeded
	}

	// RL.ALL decides both limiters at once: a request denied by one
	// consumes from neither. In Valkey Cluster all keys of one RL.ALL must
	// hash to one slot (else CROSSSLOT), and these two do not. There, put one
	// hash tag in both keys (<prefix>:{key:<apikey>} and
	// <prefix>:{key:<apikey>}:ip:<ip>, which limits per key and IP: a
	// different policy), or make two calls (RL.GCRA, then RL.WINDOW) and lose
	// the all-or-nothing. In standalone Valkey any keys work.
	// The read timeout is what is left of the deadline.
	reply, err := redis.Values(redis.DoWithTimeout(conn, left, "RL.ALL", 2,
		c.Prefix+":key:"+apiKey, c.Prefix+":ip:"+ip,
		"GCRA", c.KeyBurst, c.KeyRate, fmt.Sprintf("%ds", c.KeyPeriod),
		"WINDOW", c.IPLimit, fmt.Sprintf("%ds", c.IPPeriod), "SLIDING"))
	if err != nil {
		return Decision{}, err
	}
	return parseReply(reply)
}

// parseReply reads the RESP2 reply: [allowed, retry_after_ms, [[allowed,
// limit, remaining, retry_after_ms, reset_after_ms], [..the ip limiter..]]].
func parseReply(reply []interface{}) (Decision, error) {
	if len(reply) < 3 {
		return Decision{}, fmt.Errorf("unexpected RL.ALL reply: %v", reply)
	}
	allowed, err := redis.Int64(reply[0], nil)
	retry, err2 := redis.Int64(reply[1], nil)
	items, err3 := redis.Values(reply[2], nil)
	if err == nil {
		err = err2
	}
	if err == nil {
		err = err3
	}
	if err != nil || len(items) != 2 {
		return Decision{}, fmt.Errorf("unexpected RL.ALL reply: %v (%v)", reply, err)
	}
	d := Decision{Allowed: allowed == 1, RetryAfterMs: retry}
	for i, name := range []string{"key", "ip"} {
		f, err := redis.Int64s(items[i], nil)
		if err != nil || len(f) != 5 {
			return Decision{}, fmt.Errorf("unexpected RL.ALL reply for %s: %v (%v)", name, items[i], err)
		}
		d.Limiters = append(d.Limiters, Limiter{name, f[0] == 1, f[1], f[2], f[3], f[4]})
	}
	return d, nil
}

// warn logs a failure, one line per 10 s at most: a down Valkey under load
// would otherwise log a line per request.
func (rl *RateLimiter) warn(err error) {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	rl.failures++
	if time.Since(rl.lastWarn) >= 10*time.Second {
		log.Printf("rate limiter unavailable (%d failure(s) since the last report), failing %s: %v",
			rl.failures, rl.cfg.FailureMode, err)
		rl.lastWarn = time.Now()
		rl.failures = 0
	}
}

// ---------------------------------------------------------------- the middleware

type clientIPKey struct{}

// ClientIPFrom returns the client IP the middleware limited, for the
// handlers behind it.
func ClientIPFrom(ctx context.Context) string {
	ip, _ := ctx.Value(clientIPKey{}).(string)
	return ip
}

// Middleware limits every request to next: 401 without an API key, 429 when
// limited, rate-limit headers on every decision, the failure policy when
// Valkey cannot decide.
func (rl *RateLimiter) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Who: the API key (a production service would rather hash it, or
		// use the account it authenticates to) and the client IP.
		// (Header.Get: of a repeated X-API-Key, the first.)
		apiKey := strings.TrimSpace(r.Header.Get("X-API-Key"))
		if apiKey == "" {
			writeJSON(w, http.StatusUnauthorized, map[string]interface{}{"error": "missing API key"})
			return
		}
		if len(apiKey) > MaxAPIKeyBytes {
			writeJSON(w, http.StatusUnauthorized, map[string]interface{}{"error": "API key too long"})
			return
		}
		ip := ClientIP(r.RemoteAddr, r.Header.Values("X-Forwarded-For"), rl.cfg.TrustedProxies)
		r = r.WithContext(context.WithValue(r.Context(), clientIPKey{}, ip))

		d, err := rl.Check(r.Context(), apiKey, ip)
		if err != nil {
			rl.warn(err)
			if rl.cfg.FailureMode == FailClosed {
				w.Header().Set("Retry-After", "1")
				writeJSON(w, http.StatusServiceUnavailable, map[string]interface{}{"error": "rate limiter unavailable"})
				return
			}
			next.ServeHTTP(w, r) // fail open: serve, without rate headers
			return
		}

		rl.setHeaders(w.Header(), d)
		if !d.Allowed {
			body := map[string]interface{}{"error": "rate limited", "retry_after": nil}
			if s, ok := d.RetryAfterSeconds(); ok {
				body["retry_after"] = s
			}
			writeJSON(w, http.StatusTooManyRequests, body)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// setHeaders sets the rate-limit headers of a decision
// (draft-ietf-httpapi-ratelimit-headers, -07 and later, plus the older
// X-RateLimit-*), on 200 and 429 alike, and Retry-After on a 429. (Go sends
// them as Ratelimit-Policy, X-Ratelimit-...: header names are
// case-insensitive.)
func (rl *RateLimiter) setHeaders(h http.Header, d Decision) {
	b := d.Binding()
	reset := strconv.FormatInt(ceilSeconds(b.ResetAfterMs), 10)
	h.Set("RateLimit-Policy", rl.policy)
	h.Set("RateLimit", fmt.Sprintf(`"%s";r=%d;t=%s`, b.Name, b.Remaining, reset))
	h.Set("X-RateLimit-Limit", strconv.FormatInt(b.Limit, 10))
	h.Set("X-RateLimit-Remaining", strconv.FormatInt(b.Remaining, 10))
	h.Set("X-RateLimit-Reset", reset)
	if s, ok := d.RetryAfterSeconds(); ok && !d.Allowed {
		h.Set("Retry-After", strconv.FormatInt(s, 10))
	}
}

func writeJSON(w http.ResponseWriter, status int, body interface{}) {
	data, _ := json.Marshal(body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(status)
	_, _ = w.Write(data)
}
