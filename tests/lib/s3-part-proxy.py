#!/usr/bin/env python3
"""A TCP proxy in front of radosgw for tests/suites/s3.sh's multipart upload checks.

Usage: s3-part-proxy.py LISTEN_PORT UPSTREAM_PORT MODE [PART_LOG]
  cut   cuts every connection whose request names partNumber=3 (an upload that never finishes)
  slow  logs each part number it sees to PART_LOG and, once part 2 starts, forwards that
        connection at about 160 KiB/s (parts in flight together are visible in the log)
"""
import re
import socket
import sys
import threading
import time

lport, rport, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
log = sys.argv[4] if len(sys.argv) > 4 else None
lock = threading.Lock()


def pipe(a, b, up):
    slow, tail = False, b""
    try:
        while True:
            d = a.recv(16384 if slow else 65536)
            if not d:
                break
            if up:
                seen = tail + d
                if mode == "cut" and b"partNumber=3&" in seen:
                    break
                if mode == "slow":
                    for n in re.findall(rb"partNumber=(\d+)&", seen):
                        with lock, open(log, "a") as f:
                            f.write("part %s\n" % n.decode())
                        slow = slow or n == b"2"
                tail = d[-24:]
            b.sendall(d)
            if slow:
                time.sleep(0.1)
    except OSError:
        pass
    for s in (a, b):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def conn(c):
    u = socket.create_connection(("127.0.0.1", rport))
    threading.Thread(target=pipe, args=(u, c, False), daemon=True).start()
    pipe(c, u, True)


srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", lport))
srv.listen(16)
while True:
    c, _ = srv.accept()
    threading.Thread(target=conn, args=(c,), daemon=True).start()
