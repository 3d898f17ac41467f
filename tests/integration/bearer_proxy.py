#!/usr/bin/env python3
"""A reverse proxy for tests whose client cannot send an API key (the MCP conformance suite):
each request goes to 127.0.0.1:UPSTREAM with "Authorization: Bearer KEY" added, and the answer
comes back as it streams (SSE included). Prints its port. Usage: bearer_proxy.py UPSTREAM KEY"""
import http.client, http.server, socketserver, sys, threading
UP, KEY = int(sys.argv[1]), sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def any(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else None
        h = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length", "connection")}
        h["Authorization"] = "Bearer " + KEY
        c = http.client.HTTPConnection("127.0.0.1", UP, timeout=600)
        c.request(self.command, self.path, body=body, headers=h)
        r = c.getresponse()
        self.send_response(r.status)
        for k, v in r.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        if r.status in (204, 304):
            self.end_headers()
            c.close()
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        while True:
            d = r.read1(65536)
            if not d: break
            self.wfile.write(b"%x\r\n%s\r\n" % (len(d), d)); self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n"); self.wfile.flush()
        c.close()
    do_GET = do_POST = do_DELETE = any
    def log_message(self, *a): pass
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a client that hung up
s = S(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
