"""Name the network failure behind an exception or a traceback line (the same table for live errors and logs).

| kind         | typical text                                                                       |
|--------------|------------------------------------------------------------------------------------|
| dns          | Name or service not known · nodename nor servname · getaddrinfo failed · Errno -2/-3 |
| refused      | Connection refused · Errno 111/61 · ECONNREFUSED · actively refused                  |
| tls_http     | SSL: WRONG_VERSION_NUMBER · wrong version number (https:// to a plain-HTTP port)     |
| tls          | CERTIFICATE_VERIFY_FAILED · self-signed certificate · SSLError · handshake failure  |
| proxy        | ProxyError · 407 Proxy Authentication Required · Tunnel connection failed · socksio |
| timeout      | ReadTimeout · ConnectTimeout · timed out · TimeoutError                               |
| unreachable  | Network is unreachable · No route to host                                           |
| protocol     | RemoteProtocolError · Server disconnected · peer closed connection · incomplete chunked read |
"""
from __future__ import annotations

import re

NETWORK_PATTERNS: tuple[tuple[str, re.Pattern], ...] = (
    ("proxy", re.compile(r"ProxyError|407 Proxy Authentication|Tunnel connection failed|socksio|"
                         r"Unable to connect to proxy|Cannot connect to proxy", re.IGNORECASE)),
    ("dns", re.compile(r"Name or service not known|nodename nor servname|getaddrinfo failed|Temporary failure "
                       r"in name resolution|No address associated with hostname|Errno -[23]\]|Errno 11001|"
                       r"Could not resolve host|NameResolutionError|ENOTFOUND|EAI_AGAIN", re.IGNORECASE)),
    ("refused", re.compile(r"Connection refused|Errno 111\]|Errno 61\]|ECONNREFUSED|actively refused|"
                           r"WinError 10061", re.IGNORECASE)),
    ("tls_http", re.compile(r"WRONG_VERSION_NUMBER|wrong version number|record layer failure|"
                            r"http request to an https server", re.IGNORECASE)),
    ("tls", re.compile(r"CERTIFICATE_VERIFY_FAILED|certificate verify failed|self[- ]signed certificate|"
                       r"SSLError|SSL: |handshake failure|hostname mismatch|unable to get local issuer", re.IGNORECASE)),
    ("timeout", re.compile(r"ReadTimeout|ConnectTimeout|WriteTimeout|PoolTimeout|timed out|TimeoutError|"
                           r"APITimeoutError|Request timed out", re.IGNORECASE)),
    ("unreachable", re.compile(r"Network is unreachable|No route to host|Errno 101\]|Errno 113\]", re.IGNORECASE)),
    ("protocol", re.compile(r"RemoteProtocolError|Server disconnected|peer closed connection|incomplete chunked|"
                            r"Connection reset by peer|ConnectionResetError|RemoteDisconnected", re.IGNORECASE)),
)


def classify_network_text(text: str | None) -> str | None:
    """The first network failure kind whose pattern occurs in `text`, or None."""
    if not text:
        return None
    for kind, pattern in NETWORK_PATTERNS:
        if pattern.search(text):
            return kind
    return None


def exception_text(exc: BaseException) -> str:
    """The exception and its causes as one line (httpx hides the OS error in `__cause__`/`__context__`)."""
    parts, seen, texts, cur = [], set(), set(), exc
    while cur is not None and id(cur) not in seen and len(parts) < 6:
        seen.add(id(cur))
        if str(cur) not in texts:
            texts.add(str(cur))
            parts.append(f"{type(cur).__name__}: {cur}")
        cur = cur.__cause__ or cur.__context__
    return " <- ".join(parts)
