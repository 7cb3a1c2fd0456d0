"""HTTPS for the admin port: the ``[http] tls_cert_file`` / ``tls_key_file`` pair and the server's
``ssl.SSLContext`` built from it (CONTRACT 1; docs/OPERATIONS.md "HTTPS").

A problem names the key and the file, never the file's content (a key file is a secret).
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Protocol


class TlsFiles(Protocol):
    """The certificate chain (PEM) and its private key (PEM, unencrypted) the admin port serves with (the config's
    ``[http]`` pair, ``daemon/config/model.py``: http never imports config)."""

    @property
    def cert_file(self) -> Path: ...

    @property
    def key_file(self) -> Path: ...


def server_context(files: TlsFiles) -> ssl.SSLContext:
    """A TLS 1.2+ server context; raises ``ValueError`` with a clear, secret-free message if the files
    cannot be used (missing, unreadable, not PEM, key not matching the certificate)."""
    problem = _unreadable(files)
    if problem is not None:
        raise ValueError(problem)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        # password=b"": an encrypted key fails here instead of prompting on the terminal
        context.load_cert_chain(files.cert_file, files.key_file, password=b"")
    except ssl.SSLError as exc:
        # the reason (e.g. KEY_VALUES_MISMATCH, NO_START_LINE) names the defect, never a byte of the key
        reason = exc.reason or "not a PEM certificate and matching unencrypted private key"
        raise ValueError(
            f"http.tls_cert_file {files.cert_file} and http.tls_key_file {files.key_file} cannot be loaded: {reason}"
        ) from None
    except OSError as exc:
        raise ValueError(f"http.tls_cert_file / http.tls_key_file cannot be read: {exc.strerror or exc}") from None
    return context


def load_problem(files: TlsFiles | None) -> str | None:
    """Why ``files`` cannot serve HTTPS, or None (also when TLS is off)."""
    if files is None:
        return None
    try:
        server_context(files)
    except ValueError as exc:
        return str(exc)
    return None


def _unreadable(files: TlsFiles) -> str | None:
    for key, path in (("http.tls_cert_file", files.cert_file), ("http.tls_key_file", files.key_file)):
        try:
            with open(path, "rb"):
                pass
        except FileNotFoundError:
            return f"{key} {path} does not exist"
        except IsADirectoryError:
            return f"{key} {path} is a directory, not a PEM file"
        except OSError as exc:
            return f"{key} {path} cannot be read: {exc.strerror or exc}"
    return None
