package opensandboxtest

import (
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"

	"github.com/gorilla/websocket"

	"github.com/tetherfleet/tether/protocol/opensandbox"
)

// strippedHeaders never reach the sandbox through the server proxy
// (wire-facts §2.5, OSB-13).
var strippedHeaders = []string{"Authorization", "Cookie", opensandbox.HeaderAPIKey}

// wsHandshakeHeaders are set by the WebSocket dialer itself and must not be
// copied from the client's request.
var wsHandshakeHeaders = []string{
	"Upgrade", "Connection", "Sec-Websocket-Key", "Sec-Websocket-Version", "Sec-Websocket-Extensions",
	"Sec-Websocket-Protocol", "Host", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding",
}

// proxy serves /sandboxes/<id>/proxy/<port>/...: HTTP through a reverse
// proxy, WebSocket upgrades through a frame relay. Only the execd port has
// a backend; other ports answer 502 (HTTP) or close 1011 (WebSocket).
func (s *Server) proxy(w http.ResponseWriter, r *http.Request, route opensandbox.Route) {
	s.mu.Lock()
	sb, ok := s.sandboxes[route.ID]
	var addr string
	if ok {
		addr = sb.addr
	}
	s.mu.Unlock()
	if !ok {
		writeNotFound(w, route.ID)
		return
	}
	if route.Port != opensandbox.DefaultExecdPort {
		addr = ""
	}
	path := route.Rest
	if path == "" {
		path = "/"
	}
	if websocket.IsWebSocketUpgrade(r) {
		s.proxyWebSocket(w, r, addr, path)
		return
	}
	if addr == "" {
		writeJSON(w, http.StatusBadGateway, opensandbox.ErrorBody{Code: opensandbox.CodeRuntimeError, Message: "nothing listens on port " + r.URL.Path})
		return
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL = &url.URL{Scheme: "http", Host: addr, Path: path, RawQuery: pr.In.URL.RawQuery}
			pr.Out.Host = addr
			for _, h := range strippedHeaders {
				pr.Out.Header.Del(h)
			}
			setIfAbsent(pr.Out.Header, "X-Forwarded-Proto", "http")
			setIfAbsent(pr.Out.Header, "X-Forwarded-Host", pr.In.Host)
			if host, _, err := net.SplitHostPort(pr.In.RemoteAddr); err == nil {
				setIfAbsent(pr.Out.Header, "X-Forwarded-For", host)
			}
		},
		Transport:     s.transport,
		FlushInterval: -1, // command events stream
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			var op *net.OpError
			status := http.StatusInternalServerError
			if errors.As(err, &op) && op.Op == "dial" {
				status = http.StatusBadGateway // OSB-10
			}
			writeJSON(w, status, opensandbox.ErrorBody{Code: opensandbox.CodeRuntimeError, Message: "proxy to sandbox: " + err.Error()})
		},
	}
	// Full duplex, as a real server's proxy behaves: without it the Go
	// HTTP/1 server closes the request body when the answer's headers go
	// out, the transport's last read of it fails, and it drops execd's
	// connection mid-answer (golang/go#40747).
	_ = http.NewResponseController(w).EnableFullDuplex()
	rp.ServeHTTP(w, r)
	// No Read of the body may be in flight once the handler returns: its
	// EOF would start the server's background read too late, and the
	// next request's read panics (golang/go#68560). Close waits for it.
	r.Body.Close()
}

func setIfAbsent(h http.Header, k, v string) {
	if h.Get(k) == "" {
		h.Set(k, v)
	}
}

// proxyWebSocket accepts the client's socket, then dials execd: a refused
// backend handshake closes the client with 1008 and an unreachable backend
// with 1011 (wire-facts §2.5, PTY-8). Otherwise it relays frames and close
// codes both ways until either side ends.
func (s *Server) proxyWebSocket(w http.ResponseWriter, r *http.Request, addr, path string) {
	up := websocket.Upgrader{CheckOrigin: func(*http.Request) bool { return true }}
	client, err := up.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	defer client.Close()
	closeClient := func(code int) {
		client.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, ""), time.Now().Add(time.Second))
	}
	if addr == "" {
		closeClient(websocket.CloseInternalServerErr)
		return
	}
	hdr := r.Header.Clone()
	for _, h := range append(wsHandshakeHeaders, strippedHeaders...) {
		hdr.Del(h)
	}
	u := url.URL{Scheme: "ws", Host: addr, Path: path, RawQuery: r.URL.RawQuery}
	dialer := websocket.Dialer{HandshakeTimeout: 10 * time.Second, NetDialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext}
	backend, resp, err := dialer.DialContext(r.Context(), u.String(), hdr)
	if err != nil {
		if resp != nil {
			resp.Body.Close()
			closeClient(websocket.ClosePolicyViolation)
		} else {
			closeClient(websocket.CloseInternalServerErr)
		}
		return
	}
	defer backend.Close()

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer s.wg.Done()
		defer close(done)
		relay(backend, client)
	}()
	relay(client, backend)
	<-done
}

// relay copies messages from src to dst until src ends; it then passes
// src's close code and reason on to dst (or, if src broke without a close
// frame, closes dst's connection).
func relay(dst, src *websocket.Conn) {
	for {
		typ, data, err := src.ReadMessage()
		if err != nil {
			var ce *websocket.CloseError
			if errors.As(err, &ce) && ce.Code != websocket.CloseAbnormalClosure {
				dst.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(ce.Code, ce.Text), time.Now().Add(time.Second))
			}
			dst.Close()
			return
		}
		dst.SetWriteDeadline(time.Now().Add(DefaultWriteTimeout))
		if err := dst.WriteMessage(typ, data); err != nil {
			src.Close()
			return
		}
	}
}
