"""Each narrow store port and the contract tests that hold every store implementation to it.

``actors/ports.py`` splits the store into narrow ports; ``TaskStore`` is their union, what an adapter implements.
The contract suites (``tests/test_store_contract.py``, ``..._cascade.py``, ``..._idempotency.py``) run each test
against every implementation (their ``harness`` fixture); this map says which of those tests make up each port's
suite, and the checks below keep the map honest: the ports partition ``TaskStore``, every test named exists, and
every method of a port is called by at least one test of its suite.
"""

from __future__ import annotations

import inspect
import re
from types import ModuleType
from typing import Generic, Protocol

import pytest

from scheduler_gateway.actors import store_ports as ports
from tests import test_store_contract as contract
from tests import test_store_contract_artifacts as artifacts
from tests import test_store_contract_cascade as cascade
from tests import test_store_contract_flow as flow
from tests import test_store_contract_idempotency as idempotency
from tests import test_store_contract_kinds as kinds
from tests import test_store_contract_nodes as nodes
from tests import test_store_contract_search as search

SUITES: dict[type, list[tuple[ModuleType, str]]] = {
    ports.StoreLifecycle: [
        (contract, "test_data_survives_stop_and_start"),
        (contract, "test_stop_is_idempotent_and_writes_after_stop_fail"),
        (contract, "test_stop_before_start_is_fine"),
    ],
    ports.NodePart: [(contract, "test_ping")],
    ports.TaskReads: [
        (contract, "test_insert_get_round_trip_keeps_payload_bytes"),
        (contract, "test_get_tasks_reads_the_stored_ones_in_one_call"),
        (contract, "test_history_oldest_first_with_paging"),
        (contract, "test_list_tasks_filters_cursor_and_limit_clamp"),
        (contract, "test_list_tasks_limit_is_clamped_to_500"),
        (contract, "test_lease_seen"),
        (contract, "test_active_tasks"),
    ],
    ports.TaskCounts: [
        (cascade, "test_task_counts_group_by_state_and_kind"),
    ],
    ports.TaskSearchStore: [
        (search, "test_search_filters_order_cursors_and_count"),
        (search, "test_search_pages_forward_and_back"),
        (search, "test_task_refs_are_the_matching_ids_with_their_revisions"),
        (search, "test_minute_figures_are_written_with_each_transition_and_survive_a_reopen"),
        (search, "test_counts_by_owner_kind_and_state_follow_every_write"),
        (search, "test_a_created_range_is_exact_whatever_the_ids_say"),
    ],
    ports.TaskWrites: [
        (flow, "test_a_claim_over_the_kinds_concurrency_is_refused_limited_alone"),
        (flow, "test_one_live_task_per_unique_key_and_per_window"),
        (contract, "test_insert_get_round_trip_keeps_payload_bytes"),
        (contract, "test_result_bytes_and_error_round_trip"),
        (contract, "test_cas_success_bumps_revision"),
        (contract, "test_same_revision_rewrite_is_allowed"),
        (contract, "test_stale_revision_is_refused_and_row_unchanged"),
        (contract, "test_update_of_missing_task_is_task_not_found"),
        (contract, "test_duplicate_insert_is_revision_conflict"),
        (contract, "test_apply_many_one_stale_in_the_middle"),
        (contract, "test_apply_many_mixes_refusals_of_every_kind"),
        (contract, "test_apply_many_insert_then_update_same_task"),
        (contract, "test_apply_many_update_before_its_insert_is_not_found"),
        (contract, "test_apply_many_empty"),
        (contract, "test_concurrent_cas_at_the_same_revision_exactly_one_wins"),
        (contract, "test_many_concurrent_writers_all_land"),
        (contract, "test_history_entry_at_an_existing_revision_is_refused"),
        (cascade, "test_a_group_commits_whole_or_not_at_all"),
        (cascade, "test_a_group_that_closes_a_subtree_is_refused_while_a_task_below_is_active"),
        (cascade, "test_no_task_is_created_under_a_terminal_parent"),
        (cascade, "test_a_child_cannot_be_created_in_the_batch_after_its_parent_was_canceled"),
        (cascade, "test_a_canceled_child_is_not_requeued_under_a_canceled_parent"),
    ],
    ports.IdempotencyStore: [
        (contract, "test_idempotency_duplicate_is_refused_and_task_not_inserted"),
        (contract, "test_idempotency_duplicate_inside_one_batch"),
        (idempotency, "test_put_idempotency_takes_a_free_key_once"),
        (idempotency, "test_put_idempotency_and_a_change_share_one_key_space"),
    ],
    ports.AuditStore: [
        (contract, "test_audit_filters_and_paging"),
    ],
    ports.OutboxStore: [
        (contract, "test_outbox_order_and_delete"),
    ],
    ports.DeadLetterStore: [
        (contract, "test_dead_letter_upsert_by_task"),
        (contract, "test_dead_letter_id_of_another_task_is_refused"),
        (contract, "test_dead_letter_get_list_filters_and_put"),
        (contract, "test_dead_letter_sweep_queries_never_return_archived_and_are_bounded"),
    ],
    ports.PrincipalStore: [
        (contract, "test_principals"),
        (contract, "test_revoked_tokens_are_gone_and_logged_for_every_cache"),
        (contract, "test_last_use_is_kept_beside_the_token_and_never_moves_back"),
    ],
    ports.NodeStore: [
        (contract, "test_nodes"),
        (nodes, "test_a_late_flush_never_takes_a_heartbeat_back"),
        (nodes, "test_a_flush_never_undoes_a_drain_and_only_a_drain_moves_the_flag"),
    ],
    ports.KindStore: [
        (flow, "test_kind_settings_are_kept_with_their_audit_and_event"),
        (kinds, "test_a_change_is_written_only_over_the_document_it_was_decided_on"),
    ],
    ports.ArtifactStore: [
        (artifacts, "test_an_artifact_is_recorded_once_with_its_audit_and_event"),
        (artifacts, "test_only_a_running_task_at_the_checked_revision_takes_an_artifact"),
        (artifacts, "test_the_limits_refuse_and_write_nothing"),
        (artifacts, "test_retention_marks_the_rows_of_old_finished_tasks_then_deletes_them"),
        (artifacts, "test_retention_keeps_a_task_until_its_artifacts_are_gone"),
    ],
    ports.CallbackStore: [
        (contract, "test_callback_delivery_commits_with_its_change_and_is_listed_by_due_time"),
        (contract, "test_pending_callbacks_page_with_a_due_at_and_id_cursor"),
        (contract, "test_a_refused_change_writes_no_callback_delivery"),
        (contract, "test_callback_reschedule_finish_and_dead_letter"),
        (contract, "test_callback_dead_letters_list_by_owner_and_task_with_paging"),
        (contract, "test_redeliver_takes_the_letter_once"),
        (cascade, "test_callback_backlog_of_an_owner_counts_its_tasks_deliveries"),
    ],
}


def methods(port: type) -> set[str]:
    """The methods a port declares itself (not those of the ports it unites)."""
    return {name for name, value in vars(port).items() if inspect.isfunction(value) and not name.startswith("_")}


def union_methods(port: type) -> set[str]:
    return set().union(*(methods(base) for base in port.__mro__ if base in SUITES or base is port))


#: a store's parts (``TaskStore``'s properties) and the port each implements
PARTS = {
    "tasks": ports.TaskPart,
    "search": ports.TaskSearchStore,
    "letters": ports.DeadLetterStore,
    "nodes": ports.NodePart,
    "kinds": ports.KindStore,
    "artifacts": ports.ArtifactStore,
    "callbacks": ports.CallbackStore,
}


def test_the_narrow_ports_partition_the_task_store() -> None:
    assert methods(ports.TaskStore) == set(), "TaskStore names the parts, each called directly"
    parts = {name for base in ports.TaskStore.__mro__ for name, v in vars(base).items() if isinstance(v, property)}
    assert parts == set(PARTS), "every part of TaskStore is in PARTS"
    narrow = {
        b for part in PARTS.values() for b in part.__mro__ if b not in (Protocol, Generic, object, ports.TaskPart)
    }
    assert narrow | {ports.StoreLifecycle} == set(SUITES), "every narrow port has a suite in SUITES"
    seen: dict[str, type] = {}
    for port in SUITES:
        for name in methods(port):
            assert name not in seen, f"{name} is in both {seen[name].__name__} and {port.__name__}"
            seen[name] = port
    every = methods(ports.StoreLifecycle).union(*(union_methods(part) for part in PARTS.values()))
    assert set(seen) == every


@pytest.mark.parametrize("port", list(SUITES), ids=lambda p: p.__name__)
def test_each_port_has_a_suite_that_calls_every_method(port: type) -> None:
    sources = []
    for module, name in SUITES[port]:
        fn = getattr(module, name, None)
        assert fn is not None, f"{module.__name__}.{name} is gone: update SUITES"
        sources.append(inspect.getsource(fn))
    text = "\n".join(sources)
    untested = sorted(m for m in methods(port) if not re.search(rf"\.{m}\(", text))
    assert not untested, f"{port.__name__}: no test of its suite calls {untested}"
