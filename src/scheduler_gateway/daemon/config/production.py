"""The production rules for weak secrets: which given secret is too weak, named by key, never by value."""

from __future__ import annotations

from urllib.parse import SplitResult, urlsplit

from scheduler_gateway.daemon.config.model import MIN_SECRET_LEN, WELL_KNOWN_SECRETS, Config


def _split_url_password(url: str) -> tuple[SplitResult, str | None]:
    """The parsed URL and the secret in its userinfo: the password of ``user:pw@``, or the token of
    ``token@`` (NATS reads a userinfo without a colon as a token)."""
    parts = urlsplit(url)
    userinfo, at, _ = parts.netloc.rpartition("@")
    if not at:
        return parts, None
    if ":" in userinfo:
        return parts, userinfo.split(":", 1)[1]
    return parts, userinfo


def production_problems(config: Config) -> list[str]:
    """Weak secrets among those given: each message names the key, never the value.

    Returns the findings whatever the mode: ``gatewayd run`` refuses to start on any of
    them in production; in dev mode they are warnings. A secret that is not given (no
    ``[callbacks] secret``) is not a finding.
    """
    problems: list[str] = []
    candidates: list[tuple[str, str | None]] = [
        ("callbacks.secret", config.callbacks.secret),
        ("nats.password", config.nats.password),
    ]
    for i, server in enumerate(config.nats.servers):
        _, url_password = _split_url_password(server)
        if url_password is not None:
            where = "" if len(config.nats.servers) == 1 else f" #{i + 1}"
            label = f"nats.url{where} (password or token)"
            candidates.append((label, url_password))
    for key, value in candidates:
        finding = weak_secret_reason(value)
        if finding is not None:
            problems.append(f"{key} {finding}")
    return problems


def weak_secret_reason(value: str | None) -> str | None:
    """Why a given secret is too weak for production (no value in the text), or None if it is fine."""
    if value is None:
        return None
    if value.strip() == "":
        return "is empty"
    if value.strip().lower() in WELL_KNOWN_SECRETS:
        return "is a well-known default secret"
    if len(value) < MIN_SECRET_LEN:
        return f"is shorter than {MIN_SECRET_LEN} characters"
    return None
