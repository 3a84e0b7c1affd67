"""The lab's apt proxy: a small forwarding HTTP proxy on the lab bridge, the nodes' only way out.

It forwards GET and HEAD to an allowlist of hosts (the host names in the lab host's apt
sources, given by dtlab.lab) and refuses everything else, logging each refusal. The nodes
have no default route; apt reaches Debian through this proxy (Acquire::http::Proxy).
With --cache-dir it keeps each fetched .deb and serves it again (fresh test labs converge
without downloading the same packages every session); index files are always fetched.

    python -m dtlab.aptproxy --listen 10.213.77.1:3142 --allow <mirror host> [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import logging
import os
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

UPSTREAM_TIMEOUT_S = 30
CLIENT_TIMEOUT_S = 120
CHUNK_BYTES = 256 * 1024
# Headers that describe one hop, not the message (RFC 9110 7.6.1); never forwarded.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
              "te", "trailer", "transfer-encoding", "upgrade"}

log = logging.getLogger("dtlab.aptproxy")


class AptProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = CLIENT_TIMEOUT_S
    allowed_hosts: frozenset[str] = frozenset()
    # Where .deb files are kept once fetched (None: no cache). A .deb's URL names one immutable
    # build, and apt checks its hash against the signed index, so serving it again is safe.
    cache_dir: Path | None = None

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._forward()

    def do_HEAD(self) -> None:  # noqa: N802
        self._forward()

    def _refuse(self, code: int, why: str) -> None:
        log.warning("refused %s %s from %s: %s", self.command, self.path, self.client_address[0], why)
        self.send_error(code, why)

    # Every other method (CONNECT, POST, ...) is refused.
    def __getattr__(self, name: str):
        if name.startswith("do_"):
            return lambda: self._refuse(405, "only GET and HEAD are forwarded")
        raise AttributeError(name)

    def _forward(self) -> None:
        target = urlsplit(self.path)
        if target.scheme != "http" or not target.hostname:
            return self._refuse(400, "expected an absolute http:// URL (use me as an HTTP proxy)")
        if target.hostname not in self.allowed_hosts:
            return self._refuse(403, f"host {target.hostname} is not an apt source of the lab host")
        path = target.path or "/"
        if target.query:
            path += "?" + target.query
        cache_path = self._cache_path(target.hostname, target.path) if not target.query else None
        if cache_path and cache_path.is_file():
            return self._serve_cached(cache_path)
        headers = {name: value for name, value in self.headers.items() if name.lower() not in HOP_BY_HOP}
        upstream = http.client.HTTPConnection(target.hostname, target.port or 80, timeout=UPSTREAM_TIMEOUT_S)
        try:
            upstream.request(self.command, path, headers=headers)
            response = upstream.getresponse()
            self.send_response(response.status, response.reason)
            for name, value in response.getheaders():
                if name.lower() not in HOP_BY_HOP:
                    self.send_header(name, value)
            length = response.getheader("Content-Length")
            if length is None and self.command != "HEAD":
                self.close_connection = True  # body length unknown: end it by closing
                self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                keep = cache_path if response.status == 200 and length is not None else None
                self._relay(response, keep, int(length) if keep else 0)
            log.info("%s %s -> %s", self.command, self.path, response.status)
        except (OSError, http.client.HTTPException) as error:
            log.warning("upstream error for %s: %s", self.path, error)
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.send_error(502, f"upstream error: {error}")
        finally:
            upstream.close()

    def _cache_path(self, host: str, url_path: str) -> Path | None:
        if self.cache_dir is None or self.command != "GET" or not url_path.endswith(".deb"):
            return None
        parts = [part for part in url_path.split("/") if part not in ("", ".", "..")]
        return self.cache_dir.joinpath(host, *parts)

    def _serve_cached(self, cache_path: Path) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.debian.binary-package")
        self.send_header("Content-Length", str(cache_path.stat().st_size))
        self.end_headers()
        with open(cache_path, "rb") as cached:
            shutil.copyfileobj(cached, self.wfile, CHUNK_BYTES)
        log.info("GET %s -> 200 (cached)", self.path)

    def _relay(self, response: http.client.HTTPResponse, cache_path: Path | None, length: int) -> None:
        """Stream the body to the client; keep a complete .deb in the cache (atomically)."""
        partial = None
        if cache_path:
            cache_path.parent.mkdir(parents=True, exist_ok=True)
            partial = cache_path.with_name(f".{cache_path.name}.{os.getpid()}.{threading.get_ident()}")
        received = 0
        try:
            with open(partial, "wb") if partial else contextlib.nullcontext() as keep:
                while chunk := response.read(CHUNK_BYTES):
                    self.wfile.write(chunk)
                    received += len(chunk)
                    if keep:
                        keep.write(chunk)
            if partial and received == length:
                os.replace(partial, cache_path)
        finally:
            if partial:
                with contextlib.suppress(FileNotFoundError):
                    partial.unlink()

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (http.server's signature)
        log.debug(format, *args)


class AptProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64
    allow_reuse_address = True


def serve(listen_host: str, listen_port: int, allowed_hosts: list[str],
          cache_dir: Path | None = None) -> None:
    handler = type("Handler", (AptProxyHandler,), {"allowed_hosts": frozenset(allowed_hosts),
                                                   "cache_dir": cache_dir})
    with AptProxyServer((listen_host, listen_port), handler) as server:
        log.info("listening on %s:%d, forwarding GET/HEAD to %s", listen_host, listen_port,
                 ", ".join(sorted(allowed_hosts)))
        server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT to listen on (the lab bridge address)")
    parser.add_argument("--allow", action="append", required=True, help="host name to forward to (repeat)")
    parser.add_argument("--cache-dir", type=Path, help="keep fetched .deb files here and serve them again")
    arguments = parser.parse_args(argv)
    host, _, port = arguments.listen.rpartition(":")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    serve(host, int(port), arguments.allow, arguments.cache_dir)


if __name__ == "__main__":
    main()
