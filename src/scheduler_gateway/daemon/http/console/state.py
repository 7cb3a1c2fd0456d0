"""The console's own state, shared by its page groups: the sessions, the sign-in form's CSRF key and the sign-in
rate limit (``sessions.py``). ``Console`` builds it and hands it to each page group with the host; each part can be
replaced (tests give smaller limits and their own clock), and the pages read the current one."""

from __future__ import annotations

from scheduler_gateway.daemon.http.console.sessions import LoginCsrf, Sessions, SignInLimiter


class ConsoleState:
    def __init__(
        self,
        sessions: Sessions | None = None,
        login_csrf: LoginCsrf | None = None,
        sign_in_limit: SignInLimiter | None = None,
    ) -> None:
        self.sessions = sessions or Sessions()
        self.login_csrf = login_csrf or LoginCsrf()
        self.sign_in_limit = sign_in_limit or SignInLimiter()
