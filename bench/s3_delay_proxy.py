"""A TCP relay that adds a fixed delay to every request sent to an S3 store, for bench/s3_bench.py: the
"1 ms per request" configuration of issue 19's bench (this kernel has no sch_netem, so `tc netem` on lo is
not available; the slow passthrough under the gateway's POSIX root would delay every 128 KiB the gateway
reads from disk, not every request).

Each client connection gets its own connection to the store. What the client sends (an HTTP request: its
headers arrive in one read; the bench's clients send no bodies through it) waits DELAY before it is
forwarded; the answers flow back at once, spliced in the kernel (os.splice through a pipe: no copy through
Python), so the relay adds latency per request, not a bandwidth limit.
"""
import fcntl
import os
import socket
import threading
import time

CHUNK = 1 << 20


class DelayProxy:
    def __init__(self, target_port, delay_s, host="127.0.0.1"):
        self.target = (host, target_port)
        self.delay_s = delay_s
        self.listener = socket.create_server((host, 0))
        self.port = self.listener.getsockname()[1]
        self.endpoint = f"http://{host}:{self.port}"
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self):
        self._closed = True
        self.listener.close()

    def _accept(self):
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                store = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            for s in (client, store):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._requests, args=(client, store), daemon=True).start()
            threading.Thread(target=self._answers, args=(store, client), daemon=True).start()

    def _requests(self, client, store):
        try:
            while True:
                data = client.recv(CHUNK)
                if not data:
                    break
                time.sleep(self.delay_s)
                store.sendall(data)
        except OSError:
            pass
        finally:
            _shut(store)

    def _answers(self, store, client):
        r, w = os.pipe()
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, CHUNK)
        try:
            while True:
                n = os.splice(store.fileno(), w, CHUNK)
                if n == 0:
                    break
                while n:
                    n -= os.splice(r, client.fileno(), n)
        except OSError:
            pass
        finally:
            os.close(r)
            os.close(w)
            _shut(client)


def _shut(s):
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()
