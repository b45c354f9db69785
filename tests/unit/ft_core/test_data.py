"""The small value types shared by the client, the monitor and the launcher (NVRx's names and values)."""

from __future__ import annotations

from ft_core.data import WorkloadAction, WorkloadControlRequest


def test_workload_actions_keep_nvrx_names_and_values():
    assert {action.name: action.value for action in WorkloadAction} == {
        "Continue": 0, "ExcludeThisNode": 1, "ShutdownWorkload": 2}


def test_a_request_carries_its_action_and_an_optional_description():
    assert WorkloadControlRequest(WorkloadAction.ExcludeThisNode).description == ""
    request = WorkloadControlRequest(WorkloadAction.ShutdownWorkload, "loss diverged")
    assert (request.action, request.description) == (WorkloadAction.ShutdownWorkload, "loss diverged")
