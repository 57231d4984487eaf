package tunneltest

import (
	"bufio"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy is an HTTP CONNECT proxy on loopback, as corporate networks put
// between nodes and the outside: it answers CONNECT host:port with 200 and
// then relays raw bytes both ways, and closes a tunnel on which nothing
// passed, either way, for IdleTimeout, as such proxies do. Anything but
// CONNECT is answered 405. Start it with StartProxy; it stops when the test
// ends.
type Proxy struct {
	// URL is the proxy's URL (http://127.0.0.1:PORT), with the user info
	// of StartProxy's user and password when they were given.
	URL string

	idle     time.Duration
	auth     string            // the expected Proxy-Authorization; "" for none
	resolve  map[string]string // CONNECT target → address dialed
	ln       net.Listener
	wg       sync.WaitGroup
	mu       sync.Mutex
	tunnels  map[net.Conn]net.Conn // client → target, while relayed
	targets  []string              // every CONNECT target accepted, in order
	idleCuts atomic.Int64
	refused  atomic.Int64
}

// ProxyConfig configures StartProxy.
type ProxyConfig struct {
	// IdleTimeout closes a tunnel that carried nothing for this long.
	// Zero means never.
	IdleTimeout time.Duration
	// User and Password, if User is set, are required as
	// Proxy-Authorization: Basic; a CONNECT without them is answered 407.
	User, Password string
	// Resolve maps CONNECT targets (host:port) to the address the proxy
	// dials instead, so that tests can use names that only the proxy
	// knows (net/http never proxies loopback addresses). Targets not
	// listed are dialed as given.
	Resolve map[string]string
}

// StartProxy starts a Proxy configured by cfg.
func StartProxy(tb testing.TB, cfg ProxyConfig) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proxy{idle: cfg.IdleTimeout, resolve: cfg.Resolve, ln: ln, tunnels: map[net.Conn]net.Conn{}}
	p.URL = "http://" + ln.Addr().String()
	if cfg.User != "" {
		p.auth = "Basic " + base64.StdEncoding.EncodeToString([]byte(cfg.User+":"+cfg.Password))
		p.URL = "http://" + cfg.User + ":" + cfg.Password + "@" + ln.Addr().String()
	}
	p.wg.Add(1)
	go p.acceptLoop()
	tb.Cleanup(p.close)
	return p
}

// Targets returns the CONNECT targets the proxy accepted so far, in order.
func (p *Proxy) Targets() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.targets...)
}

// IdleCuts counts the tunnels closed for their silence.
func (p *Proxy) IdleCuts() int64 { return p.idleCuts.Load() }

// Refused counts the requests answered with an error (405, 407, 502).
func (p *Proxy) Refused() int64 { return p.refused.Load() }

// KillAll closes every tunnel being relayed (a proxy restart), and
// returns how many there were.
func (p *Proxy) KillAll() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c, t := range p.tunnels {
		c.Close()
		t.Close()
	}
	return len(p.tunnels)
}

func (p *Proxy) close() {
	p.ln.Close()
	p.KillAll()
	p.wg.Wait()
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.serve(c)
		}()
	}
}

// serve handles one client connection: one CONNECT, then the relay.
func (p *Proxy) serve(c net.Conn) {
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	answer := func(status int) {
		p.refused.Add(1)
		resp := &http.Response{StatusCode: status, ProtoMajor: 1, ProtoMinor: 1, Header: http.Header{}, Close: true}
		if status == http.StatusProxyAuthRequired {
			resp.Header.Set("Proxy-Authenticate", `Basic realm="tunneltest"`)
		}
		resp.Write(c)
	}
	if req.Method != http.MethodConnect {
		answer(http.StatusMethodNotAllowed)
		return
	}
	if p.auth != "" && req.Header.Get("Proxy-Authorization") != p.auth {
		answer(http.StatusProxyAuthRequired)
		return
	}
	addr := req.Host
	if a, ok := p.resolve[addr]; ok {
		addr = a
	}
	t, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		answer(http.StatusBadGateway)
		return
	}
	defer t.Close()
	c.SetReadDeadline(time.Time{})
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	p.mu.Lock()
	p.tunnels[c] = t
	p.targets = append(p.targets, req.Host)
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.tunnels, c)
		p.mu.Unlock()
	}()
	var last atomic.Int64 // unix ns of the last byte relayed either way
	last.Store(time.Now().UnixNano())
	var once sync.Once
	cut := func(idle bool) {
		once.Do(func() {
			if idle {
				p.idleCuts.Add(1)
			}
			c.Close()
			t.Close()
		})
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.relay(t, br, c, &last, cut) }()
	go func() { defer wg.Done(); p.relay(c, t, t, &last, cut) }()
	wg.Wait()
}

// relay copies from src (read through r) to dst until either fails, or
// until nothing passed either way for the idle timeout.
func (p *Proxy) relay(dst net.Conn, r io.Reader, src net.Conn, last *atomic.Int64, cut func(idle bool)) {
	buf := make([]byte, 32<<10)
	for {
		if p.idle > 0 {
			src.SetReadDeadline(time.Unix(0, last.Load()).Add(p.idle))
		}
		n, err := r.Read(buf)
		if n > 0 {
			last.Store(time.Now().UnixNano())
			if _, werr := dst.Write(buf[:n]); werr != nil {
				cut(false)
				return
			}
		}
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				if time.Since(time.Unix(0, last.Load())) < p.idle {
					continue // the other direction carried something
				}
				cut(true)
				return
			}
			cut(false)
			return
		}
	}
}
