"""A small TCP proxy for the PostgreSQL protocol that injects the faults a
network injects: a connection that drops while a COMMIT is in flight, and a
replication stream that stalls.

Client to server, it reads whole protocol messages, so it can recognise a
simple-query COMMIT (what psycopg2's commit() sends) and, on a seeded coin
toss, either
  - "drop_after": forward the COMMIT, swallow the server's answer and close
    both ends: the transaction committed (or not, the server decided), the
    client only sees the connection drop; or
  - "drop_before": close both ends without forwarding it: the server never
    sees the COMMIT and rolls the transaction back.
Server to client it forwards bytes as they come, except while frozen
(freeze()): then it stops reading, so a standby behind it receives nothing
new, and cut() closes every connection without delivering what is pending.

Each accepted connection gets two threads; closing a socket from cut()
wakes them up.  Every fault is counted, with what the server answered to a
swallowed COMMIT (its command tag, or "error").
"""
import random
import socket
import struct
import threading
import time

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102


def recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


class Pair:
    """One client connection and the server connection made for it."""

    def __init__(self, proxy, client, server):
        self.proxy = proxy
        self.client = client
        self.server = server
        self.swallow = False        # the answer to a forwarded COMMIT is not delivered
        self.closed = False
        self.lock = threading.Lock()

    def close(self):
        with self.lock:
            if self.closed:
                return
            self.closed = True
        for s in (self.client, self.server):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        self.proxy.forget(self)

    def client_to_server(self):
        try:
            # untyped messages first: SSL/GSS requests (the server answers
            # one byte, forwarded as is), then the startup packet or a cancel
            while True:
                head = recv_exact(self.client, 8)
                length, code = struct.unpack("!ii", head)
                body = recv_exact(self.client, length - 8)
                self.server.sendall(head + body)
                if code not in (SSL_REQUEST, GSSENC_REQUEST):
                    break
            while True:
                kind = recv_exact(self.client, 1)
                (length,) = struct.unpack("!i", recv_exact(self.client, 4))
                body = recv_exact(self.client, length - 4)
                message = kind + struct.pack("!i", length) + body
                if kind == b"Q" and body.rstrip(b"\0").strip().upper() == b"COMMIT":
                    fault = self.proxy.commit_fault()
                    if fault == "drop_before":
                        self.proxy.count("drop_before")
                        self.close()
                        return
                    if fault == "drop_after":
                        # set before forwarding: every byte the server sends
                        # from now on answers this COMMIT
                        self.swallow = True
                self.server.sendall(message)
        except (EOFError, OSError):
            pass
        self.close()

    def server_to_client(self):
        pending = b""
        try:
            while True:
                if self.proxy.frozen and not self.swallow:
                    if self.closed:
                        return
                    time.sleep(0.005)
                    continue
                chunk = self.server.recv(65536)
                if not chunk:
                    break
                if not self.swallow:
                    self.client.sendall(chunk)
                    continue
                # swallowing the answer to a COMMIT: read it up to
                # ReadyForQuery, note what the server did, then cut
                pending += chunk
                tag = "unknown"
                while len(pending) >= 5:
                    kind = pending[:1]
                    (length,) = struct.unpack("!i", pending[1:5])
                    if len(pending) < 1 + length:
                        break
                    body = pending[5:1 + length]
                    pending = pending[1 + length:]
                    if kind == b"C":
                        tag = body.rstrip(b"\0").decode()
                    elif kind == b"E":
                        tag = "error"
                    elif kind == b"Z":
                        self.proxy.count("drop_after", tag)
                        self.close()
                        return
        except (EOFError, OSError):
            pass
        self.close()


class Proxy:
    def __init__(self, listen_port, target_port, drop_after=0.0, drop_before=0.0, seed=1):
        self.target_port = target_port
        self.drop_after = drop_after
        self.drop_before = drop_before
        self.rng = random.Random(seed)
        self.frozen = False
        self.counts = {}
        self.pairs = set()
        self.lock = threading.Lock()
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", listen_port))
        self.listener.listen(128)
        self.running = True
        threading.Thread(target=self.accept_loop, daemon=True).start()

    def commit_fault(self):
        with self.lock:
            x = self.rng.random()
        if x < self.drop_after:
            return "drop_after"
        if x < self.drop_after + self.drop_before:
            return "drop_before"
        return None

    def count(self, what, tag=None):
        name = what if tag is None else "%s:%s" % (what, tag)
        with self.lock:
            self.counts[name] = self.counts.get(name, 0) + 1

    def forget(self, pair):
        with self.lock:
            self.pairs.discard(pair)

    def accept_loop(self):
        while self.running:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pair = Pair(self, client, server)
            with self.lock:
                self.pairs.add(pair)
            threading.Thread(target=pair.client_to_server, daemon=True).start()
            threading.Thread(target=pair.server_to_client, daemon=True).start()

    def freeze(self):
        """Stop delivering what servers send (a stalled network)."""
        self.frozen = True

    def cut(self):
        """Close every connection; what was not delivered is lost."""
        with self.lock:
            pairs = list(self.pairs)
        for pair in pairs:
            pair.close()

    def stop(self):
        self.running = False
        try:
            self.listener.close()
        except OSError:
            pass
        self.cut()
