"""What the console needs of the running daemon, as a Protocol: the composition root (``Gateway``) satisfies it,
and the console does not import the composition root (``http`` stays an adapter of its own)."""

from __future__ import annotations

from typing import Protocol

from scheduler_gateway.actors.artifacts import ArtifactService
from scheduler_gateway.actors.callback_sender import CallbackSender
from scheduler_gateway.actors.dead_letter_keeper import DeadLetterPolicy
from scheduler_gateway.actors.dispatcher import Dispatcher
from scheduler_gateway.actors.kinds import KindService
from scheduler_gateway.actors.nodes import NodeRegistry
from scheduler_gateway.actors.scheduling import ScheduleService
from scheduler_gateway.actors.store_ports import ConsoleStore
from scheduler_gateway.actors.tasks import TaskService
from scheduler_gateway.daemon.http.console.workflow_host import HostWorkflows
from scheduler_gateway.daemon.http.events import EventsApi
from scheduler_gateway.daemon.http.principals import PrincipalCache
from scheduler_gateway.daemon.http.settings import HttpSettings


class HostSettings(Protocol):
    @property
    def http(self) -> HttpSettings: ...
    @property
    def production(self) -> bool: ...
    @property
    def dead_letters(self) -> DeadLetterPolicy: ...


class HostScheduling(Protocol):
    @property
    def service(self) -> ScheduleService: ...


class HostArtifacts(Protocol):
    @property
    def service(self) -> ArtifactService | None: ...


class ConsoleHost(Protocol):
    @property
    def settings(self) -> HostSettings: ...
    @property
    def store(self) -> ConsoleStore: ...
    @property
    def service(self) -> TaskService: ...
    @property
    def callbacks(self) -> CallbackSender: ...
    @property
    def nodes(self) -> NodeRegistry: ...
    @property
    def principals(self) -> PrincipalCache: ...
    @property
    def events_api(self) -> EventsApi: ...
    @property
    def scheduling(self) -> HostScheduling: ...
    @property
    def kinds(self) -> KindService: ...
    @property
    def dispatcher(self) -> Dispatcher: ...
    @property
    def artifacts(self) -> HostArtifacts: ...
    @property
    def workflows(self) -> HostWorkflows: ...
