"""The test internet's web server (netlab.py): ADDR PORT DIR [CERT KEY], HTTPS with CERT."""
import functools
import http.server
import ssl
import sys


class Handler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body are separate writes: with Nagle the body waits for the peer's delayed
    # ACK (40 ms) whenever the peer is a proxy that does not answer at once, as real servers'
    # single writes do not.
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass


def main():
    addr, port, root = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    srv = http.server.ThreadingHTTPServer((addr, port),
                                          functools.partial(Handler, directory=root))
    if len(sys.argv) > 5:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(sys.argv[4], sys.argv[5])
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
